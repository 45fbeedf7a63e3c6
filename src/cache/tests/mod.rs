use super::*;
use serde::{de::DeserializeOwned, Serialize};

/// `n` bytes that do not compress (a hash's stream): entries of the sizes a test sets.
pub(super) fn noise(n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    blake3::Hasher::new()
        .update(b"noise")
        .finalize_xof()
        .fill(&mut out);
    out
}

/// What a lookup found.
pub(super) enum Lookup<M> {
    Hit(M, Vec<u8>),
    Miss,
    /// The entry was unreadable or failed its checksum; it has been removed.
    Corrupt,
}

/// The cache as its tests use it: entries of any metadata, put and got whole.
impl Cache {
    pub(super) fn with_max_bytes(mut self, max_bytes: u64) -> Cache {
        self.max_bytes = max_bytes;
        self
    }

    pub(super) fn get<M: DeserializeOwned>(&self, key: &str) -> Lookup<M> {
        let bytes = match self.read_entry(key) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return Lookup::Miss,
            Err(_) => return Lookup::Corrupt,
        };
        match decode(key, &bytes) {
            Ok((meta, binary)) => Lookup::Hit(meta, binary),
            Err(why) => {
                self.refuse(key, bytes.len() as u64, &why);
                Lookup::Corrupt
            }
        }
    }

    /// Store an entry; returns a note when it could not (the compile still succeeds).
    pub(super) fn put<M: Serialize>(&self, key: &str, meta: &M, binary: &[u8]) -> Option<String> {
        self.put_with(key, meta, binary, true)
    }

    /// Store a copy of an entry that lives elsewhere (the fleet's store): not synced to
    /// disk, since one lost or torn by a crash is a checksum miss, fetched again.
    pub(super) fn put_copy<M: Serialize>(
        &self,
        key: &str,
        meta: &M,
        binary: &[u8],
    ) -> Option<String> {
        self.put_with(key, meta, binary, false)
    }

    fn put_with<M: Serialize>(
        &self,
        key: &str,
        meta: &M,
        binary: &[u8],
        durable: bool,
    ) -> Option<String> {
        if binary.len() as u64 > MAX_ENTRY_BYTES {
            return Some(format!(
                "not cached: {} bytes is more than an entry may hold",
                binary.len()
            ));
        }
        match encode(key, meta, binary) {
            Ok(entry) => self.put_entry(key, &entry, durable),
            Err(e) => Some(format!("not cached: {e}")),
        }
    }
}

#[test]
fn roundtrip_corruption_and_eviction() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(Some(dir.path())).with_max_bytes(10_000);
    assert!(matches!(cache.get::<String>("k"), Lookup::Miss));
    assert!(cache.put("k", &"meta".to_string(), b"binary").is_none());
    match cache.get::<String>("k") {
        Lookup::Hit(m, b) => assert_eq!((m.as_str(), b.as_slice()), ("meta", &b"binary"[..])),
        _ => panic!("expected a hit"),
    }
    // Flip one byte: the entry must be reported and removed, never returned.
    let path = cache.path("k");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[10] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();
    assert!(matches!(cache.get::<String>("k"), Lookup::Corrupt));
    assert!(!path.exists());
    // Eviction keeps the directory under its bound, by the ledger and on disk.
    for i in 0..10 {
        cache.put(&format!("e{i}"), &"m".to_string(), &noise(3000));
    }
    assert!(on_disk(&cache).1 <= 10_000, "{:?}", on_disk(&cache));
    assert_eq!(cache.usage(), on_disk(&cache));
}

/// (entries, bytes) of every shard, counted on disk.
fn on_disk(cache: &Cache) -> (u64, u64) {
    let mut found = (0, 0);
    for shard in std::fs::read_dir(cache.dir()).unwrap() {
        let shard = shard.unwrap().path();
        if !shard.is_dir() {
            continue;
        }
        for e in std::fs::read_dir(shard).unwrap() {
            let path = e.unwrap().path();
            if path.extension().is_some_and(|x| x == "zeentry") {
                found = (found.0 + 1, found.1 + path.metadata().unwrap().len());
            }
        }
    }
    found
}

/// The child of `writers_killed_mid_write_leave_nothing_wrong`: writes entries of
/// many sizes into a small cache (so it evicts too) until it is killed.
#[test]
#[ignore = "the child of writers_killed_mid_write_leave_nothing_wrong"]
fn writer_child() {
    let Ok(dir) = std::env::var("XZ_CACHE_WRITER_DIR") else {
        return;
    };
    let cache = Cache::open(Some(Path::new(&dir))).with_max_bytes(300_000);
    for i in 0u64.. {
        let body = vec![i as u8; 500 + (i % 4000) as usize];
        cache.put(&key(&[&i.to_le_bytes()]), &format!("meta {i}"), &body);
    }
}

#[test]
fn writers_killed_mid_write_leave_nothing_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(Some(dir.path()));
    let kills = 8;
    for _ in 0..kills {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--ignored", "--exact", "cache::tests::writer_child"])
            .env("XZ_CACHE_WRITER_DIR", dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Killed once it has written (and evicted) a while: at no chosen point.
        let deadline = std::time::Instant::now() + Duration::from_secs(300);
        let wrote = |c: &Cache| c.ledger().map_or(0, |l| l.counter(Counter::Evictions));
        let before = wrote(&cache);
        while wrote(&cache) < before + 20 {
            assert!(
                std::time::Instant::now() < deadline,
                "the writer wrote nothing"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }
    // Every entry left is whole and its key's: nothing is loaded wrong.
    for shard in std::fs::read_dir(cache.dir()).unwrap() {
        let shard = shard.unwrap().path();
        for e in std::fs::read_dir(&shard).into_iter().flatten() {
            let path = e.unwrap().path();
            if path.extension().is_some_and(|x| x == "zeentry") {
                let key = path.file_stem().unwrap().to_str().unwrap().to_string();
                let bytes = std::fs::read(&path).unwrap();
                assert!(decode::<String>(&key, &bytes).is_ok(), "{}", path.display());
            }
        }
    }
    // The accounts: off by at most an entry per kill, exact once recounted.
    let (n, bytes) = on_disk(&cache);
    let ledger = cache.ledger().unwrap();
    assert!(
        ledger.entries().abs_diff(n) <= kills,
        "{} against {n}",
        ledger.entries()
    );
    assert!(cache.recount());
    assert_eq!(cache.usage(), (n, bytes));
}

#[test]
fn an_entry_renamed_onto_another_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(Some(dir.path()));
    cache.put("a", &"meta a".to_string(), b"binary a");
    cache.put("b", &"meta b".to_string(), b"binary b");
    std::fs::rename(cache.path("a"), cache.path("b")).unwrap();
    assert!(matches!(cache.get::<String>("b"), Lookup::Corrupt));
}

#[test]
fn temp_files_of_dead_writers_are_removed_live_ones_kept() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(Some(dir.path())).with_max_bytes(0);
    let shard = cache.shard_dir("k");
    std::fs::create_dir_all(&shard).unwrap();
    let abandoned = shard.join(format!("{TEMP_PREFIX}dead"));
    let writing = shard.join(format!("{TEMP_PREFIX}live"));
    for path in [&abandoned, &writing] {
        std::fs::write(path, b"half an entry").unwrap();
    }
    let two_hours_ago = SystemTime::now() - Duration::from_secs(7200);
    std::fs::File::options()
        .append(true)
        .open(&abandoned)
        .and_then(|f| f.set_modified(two_hours_ago))
        .unwrap();
    // A ledger's temp file left by a process killed while making it.
    let ledger_temp = cache.dir().join(format!("{TEMP_PREFIX}ledger-dead"));
    std::fs::write(&ledger_temp, b"half a ledger").unwrap();
    let file = std::fs::File::options().append(true).open(&ledger_temp);
    file.and_then(|f| f.set_modified(two_hours_ago)).unwrap();
    // Over its bound (0): the shard is cleaned, and the dead writer's file with it.
    assert!(cache.put("k", &"meta".to_string(), b"binary").is_some());
    assert!(!abandoned.exists(), "a dead writer's temp file stays");
    assert!(writing.exists(), "a live writer's temp file was removed");
    assert!(cache.recount());
    assert!(
        !ledger_temp.exists(),
        "a dead process's ledger temp file stays"
    );
}

/// Over its bound, the cache loses its least recently used entries first, whichever shard
/// they are in (a small cache too: no shard is emptied for being over a 16th), down to
/// nine tenths of the bound; an entry just used stays.
#[test]
fn the_least_recently_used_go_first_across_shards() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(Some(dir.path())).with_max_bytes(u64::MAX);
    let names: Vec<String> = (0..10).map(|i| format!("lru{i}")).collect();
    let start = SystemTime::now() - Duration::from_secs(1000);
    for (i, name) in names.iter().enumerate() {
        assert!(cache.put(name, &"m".to_string(), &noise(1000)).is_none());
        let used = start + Duration::from_secs(i as u64 * 10);
        let file = std::fs::File::options().write(true).open(cache.path(name));
        file.unwrap().set_modified(used).unwrap();
    }
    let (_, bytes) = on_disk(&cache);
    let each = bytes / 10;
    assert!(matches!(cache.get::<String>("lru0"), Lookup::Hit(..))); // now the newest
                                                                     // Bounded at ten entries: the eleventh sets off a cleaning down to nine tenths.
    let cache = cache.with_max_bytes(bytes + each / 2);
    let note = cache.put("lru10", &"m".to_string(), &noise(1000));
    assert!(note.is_some_and(|n| n.contains("evicted 2 ")));
    let kept: Vec<bool> = (0..=10)
        .map(|i| cache.path(&format!("lru{i}")).exists())
        .collect();
    let mut want = vec![true; 11];
    want[1..3].fill(false);
    assert_eq!(kept, want);
    assert_eq!(cache.usage(), on_disk(&cache));
}

/// Entries last used at the same time (time stamps are coarse; a cache restored by tar
/// has whole seconds) go only as far as needed, and only after every older entry, in
/// whichever shard each is.
#[test]
fn ties_at_the_cutoff_go_after_every_older_entry() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(Some(dir.path())).with_max_bytes(u64::MAX);
    let now = SystemTime::now();
    // Shard 00 holds ten entries used now, shard ff ten used 100 s before.
    for (name, used) in (0..10)
        .map(|i| (format!("00tie{i}"), now))
        .chain((0..10).map(|i| (format!("ffold{i}"), now - Duration::from_secs(100))))
    {
        assert!(cache.put(&name, &"m".to_string(), &noise(1000)).is_none());
        let file = std::fs::File::options().write(true).open(cache.path(&name));
        file.unwrap().set_modified(used).unwrap();
    }
    let (_, bytes) = on_disk(&cache);
    let each = bytes / 20;
    let ledger = cache.ledger().unwrap();
    // Nine tenths of ten and a half entries: eleven go.
    assert_eq!(
        upkeep::clean(cache.dir(), &ledger, each * 21 / 2, upkeep::WHOLE),
        11
    );
    let kept = |prefix: &str| {
        (0..10)
            .filter(|i| cache.path(&format!("{prefix}{i}")).exists())
            .count()
    };
    assert_eq!((kept("ffold"), kept("00tie")), (0, 9));
    assert_eq!(cache.usage(), on_disk(&cache));
}

/// A tied entry removed early in the shards never spares an older one later in them.
#[test]
fn an_older_entry_goes_even_after_a_tied_one_reached_the_target() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(Some(dir.path())).with_max_bytes(u64::MAX);
    let now = SystemTime::now();
    let old = now - Duration::from_secs(100);
    let put = |name: &str, len: usize, used: SystemTime| {
        assert!(cache.put(name, &"m".to_string(), &noise(len)).is_none());
        let file = std::fs::File::options().write(true).open(cache.path(name));
        file.unwrap().set_modified(used).unwrap();
        std::fs::metadata(cache.path(name)).unwrap().len()
    };
    // Three tied entries: half of one is more than a tenth of the cache's bound.
    let tie = (0..3).map(|i| put(&format!("00tie{i}"), 1000, now)).max();
    let (tie, older) = (tie.unwrap(), put("ffold", 10, old));
    let (_, total) = on_disk(&cache);
    // Half a tied entry more than the older one must go: the older one, and one tied.
    let max = (total - older - tie / 2) * 10 / 9;
    assert!(max < total, "not over its bound: {max} against {total}");
    let ledger = cache.ledger().unwrap();
    assert_eq!(upkeep::clean(cache.dir(), &ledger, max, upkeep::WHOLE), 2);
    assert!(!cache.path("ffold").exists());
    let tied = (0..3).filter(|i| cache.path(&format!("00tie{i}")).exists());
    assert_eq!(tied.count(), 2);
}

/// A cache without a bound holding one written entry (its directory and ledger made)
/// and `n` entries written straight into it (as a fill would), the `i`th last used `i`
/// seconds after the first; their keys.
fn filled(n: u64) -> (tempfile::TempDir, Cache, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(Some(dir.path())).with_max_bytes(u64::MAX);
    assert!(cache.put("first", &"m".to_string(), b"x").is_none());
    let start = SystemTime::now() - Duration::from_secs(2 * n);
    let keys: Vec<String> = (0..n).map(|i| key(&[b"fill", &i.to_le_bytes()])).collect();
    for (i, k) in keys.iter().enumerate() {
        std::fs::create_dir_all(cache.shard_dir(k)).unwrap();
        let file = std::fs::File::create(cache.path(k)).unwrap();
        let entry = encode(k, &"m".to_string(), &[1; 100]).unwrap();
        std::io::Write::write_all(&mut &file, &entry).unwrap();
        file.set_modified(start + Duration::from_secs(i as u64))
            .unwrap();
    }
    assert!(cache.recount());
    (dir, cache, keys)
}

/// A round whose slices are smaller than a shard goes part by part (by the keys' third
/// hex digit), a slice never listing much more than asked, and removes exactly the least
/// recently used, down to nine tenths of the bound.
#[test]
fn a_round_goes_part_by_part() {
    let (_dir, cache, keys) = filled(2000);
    let (_, bytes) = cache.usage();
    let ledger = cache.ledger().unwrap();
    let (mut calls, mut removed) = (0, 0);
    while calls == 0 || ledger.round().is_some() {
        let now = upkeep::clean(cache.dir(), &ledger, bytes - 1, 5);
        assert!(now <= 5, "{now} removed by a slice of 5");
        removed += now;
        calls += 1;
        assert!(calls < 3 * ledger::ROUND_PARTS, "the round never ended");
    }
    assert!(calls > ledger::SHARDS, "{calls} slices: not part by part");
    let kept: Vec<bool> = keys.iter().map(|k| cache.path(k).exists()).collect();
    let gone = removed as usize;
    assert!(kept[gone..].iter().all(|k| *k) && !kept[..gone].contains(&true));
    let (_, after) = on_disk(&cache);
    let each = std::fs::metadata(cache.path(&keys[1999])).unwrap().len();
    let target = (bytes - 1) - (bytes - 1) / 10;
    assert!(
        after <= target && after + each > target,
        "{after} against {target}"
    );
    assert_eq!(cache.usage(), on_disk(&cache));
}

/// A cache larger than a round's sample is cleaned a slice per write: no write removes
/// the whole tenth, the round goes on in the next writes (from the ledger, whoever makes
/// them), and what it removed is exactly the least recently used, down to under the bound.
#[test]
fn a_large_cache_is_cleaned_a_slice_per_write() {
    let (_dir, cache, keys) = filled(20_000);
    let (_, bytes) = cache.usage();
    let cache = cache.with_max_bytes(bytes);
    let ledger = cache.ledger().unwrap();
    let mut writes = 0;
    let mut removed_by_one = Vec::new();
    loop {
        let before = ledger.counter(Counter::Evictions);
        cache.put_copy(&format!("new{writes}"), &"m".to_string(), b"new");
        removed_by_one.push(ledger.counter(Counter::Evictions) - before);
        writes += 1;
        if ledger.round().is_none() || writes > 2 * ledger::SHARDS {
            break;
        }
    }
    assert!(ledger.round().is_none(), "the round never ended");
    assert!(
        writes > 2,
        "{removed_by_one:?}: the cleaning was not spread"
    );
    let total: u64 = removed_by_one.iter().sum();
    assert!(
        removed_by_one.iter().all(|r| *r < total / 2),
        "{removed_by_one:?}"
    );
    // The oldest went, and only they: what is left of the old entries is a suffix.
    let kept: Vec<bool> = keys.iter().map(|k| cache.path(k).exists()).collect();
    let first_kept = kept.iter().position(|k| *k).unwrap();
    assert!(kept[first_kept..].iter().all(|k| *k));
    assert_eq!(first_kept as u64, total);
    assert!((0..writes).all(|w| cache.path(&format!("new{w}")).exists()));
    let (_, after) = on_disk(&cache);
    assert!(
        after <= bytes && after >= bytes * 8 / 10,
        "{after} of {bytes}"
    );
    assert_eq!(cache.usage(), on_disk(&cache));
}

/// A ledger that says far more than the cache holds (a stray word, another host's removals
/// over NFS) never empties the cache: a round trusts it only within a fifth of what its
/// sample shows, else first walks every shard, setting its accounts, removing nothing.
#[test]
fn a_wrong_ledger_never_wipes_the_cache() {
    let (_dir, cache, _) = filled(20_000);
    let (_, bytes) = on_disk(&cache);
    let cache = cache.with_max_bytes(bytes);
    let ledger = cache.ledger().unwrap();
    // Shard ff: past the first round's sample, so only a walk finds the ledger wrong.
    ledger.set_shard(255, 1 << 62, 1);
    let mut writes = 0;
    while writes < 2 || ledger.round().is_some() || ledger.bytes() > bytes {
        cache.put_copy(&format!("new{writes}"), &"m".to_string(), b"new");
        writes += 1;
        assert!(writes < 2 * ledger::SHARDS as u64, "the round never ended");
    }
    let (entries, after) = on_disk(&cache);
    assert!(after >= bytes * 8 / 10, "{after} of {bytes} left");
    let (counted, _) = cache.usage();
    assert!(
        counted.abs_diff(entries) <= writes,
        "{counted} counted, {entries} on disk"
    );
}

/// A round that only walks (the ledger and its sample disagreed) goes on to the last shard
/// even when the shards it has set bring the ledger under this process's nine tenths
/// before then: it always ends, and writes stop taking the upkeep lock for it.
#[test]
fn a_walk_that_corrects_the_ledger_early_still_ends() {
    let (_dir, cache, _) = filled(20_000);
    let (_, bytes) = on_disk(&cache);
    // Well within the bound once the ledger is right.
    let cache = cache.with_max_bytes(bytes * 2);
    let ledger = cache.ledger().unwrap();
    // Shard e0: past the plan's sample (16,384 of 20,000 entries), well before ff, so the
    // walk sets it right with many shards still to go.
    ledger.set_shard(0xe0, 1 << 62, 1);
    let mut writes = 0;
    while writes < 2 || ledger.round().is_some() {
        cache.put_copy(&format!("new{writes}"), &"m".to_string(), b"new");
        writes += 1;
        assert!(writes < 2 * ledger::SHARDS as u64, "the walk never ended");
    }
    let (entries, after) = on_disk(&cache);
    assert_eq!(
        ledger.counter(Counter::Evictions),
        0,
        "a walk removes nothing"
    );
    assert!(after >= bytes, "{after} of {bytes} left");
    let counted = ledger.entries();
    assert!(
        counted.abs_diff(entries) <= writes,
        "{counted} counted, {entries} on disk"
    );
}

/// None is planned for a cache within its bound; a process whose bound is larger leaves
/// another's round alone (it neither cleans below its own nine tenths nor ends the round),
/// and the round ends once the cache is down to the target it was planned for.
#[test]
fn a_larger_bound_leaves_a_round_alone() {
    let (_dir, cache, _) = filled(2000);
    let (entries, bytes) = on_disk(&cache);
    let ledger = cache.ledger().unwrap();
    assert_eq!(
        upkeep::clean(cache.dir(), &ledger, bytes + 1, upkeep::WHOLE),
        0
    );
    assert!(ledger.round().is_none(), "a round planned within the bound");
    upkeep::clean(cache.dir(), &ledger, bytes - 1, 5);
    assert!(ledger.round().is_some());
    let left = on_disk(&cache).0;
    assert!(left < entries);
    assert_eq!(
        upkeep::clean(cache.dir(), &ledger, bytes * 2, upkeep::WHOLE),
        0
    );
    assert!(ledger.round().is_some() && on_disk(&cache).0 == left);
    upkeep::clean(cache.dir(), &ledger, bytes - 1, upkeep::WHOLE);
    assert_eq!(upkeep::clean(cache.dir(), &ledger, bytes - 1, 5), 0);
    assert!(ledger.round().is_none(), "the round never ended");
}

/// A lost ledger (a fresh boot, a restored directory) is rebuilt a slice per write: no
/// write lists the whole cache, the walk goes on in the next writes (whoever makes them),
/// removes nothing, and its end makes the accounts known and right.
#[test]
fn a_lost_ledger_is_rebuilt_a_slice_per_write() {
    let (_dir, cache, _) = filled(20_000);
    let (entries, bytes) = on_disk(&cache);
    let cache = cache.with_max_bytes(bytes * 2);
    ledger::remove(cache.dir());
    cache.put_copy("new0", &"m".to_string(), b"new");
    let ledger = cache.ledger().unwrap();
    assert_ne!(
        ledger.unknown_generation(),
        0,
        "a new ledger is not known yet"
    );
    let walked = ledger.round().expect("a walk rebuilds a lost ledger").next;
    assert!(
        walked > 0 && walked < ledger::ROUND_PARTS / 4,
        "one write walked {walked} of {} parts",
        ledger::ROUND_PARTS
    );
    let mut writes = 1;
    while ledger.round().is_some() {
        cache.put_copy(&format!("new{writes}"), &"m".to_string(), b"new");
        writes += 1;
        assert!(writes < 2 * ledger::SHARDS as u64, "the walk never ended");
    }
    assert!(writes > 4, "{writes} writes: the walk was not spread");
    assert_eq!(ledger.unknown_generation(), 0, "known once walked");
    assert_eq!(
        ledger.counter(Counter::Evictions),
        0,
        "a walk removes nothing"
    );
    let (now_entries, now_bytes) = on_disk(&cache);
    assert_eq!(now_entries, entries + writes);
    assert_eq!((ledger.entries(), ledger.bytes()), (now_entries, now_bytes));
}

/// Asked for its usage while a lost ledger is being rebuilt, the cache counts every shard
/// at once: the accounts are known and right, and the walk is over.
#[test]
fn usage_during_a_rebuild_counts_at_once_and_ends_the_walk() {
    let (_dir, cache, _) = filled(5_000);
    ledger::remove(cache.dir());
    cache.put_copy("new", &"m".to_string(), b"new");
    let ledger = cache.ledger().unwrap();
    assert!(ledger.round().is_some_and(|r| r.only_walks()));
    assert_eq!(cache.usage(), on_disk(&cache));
    assert_eq!(ledger.unknown_generation(), 0);
    assert!(ledger.round().is_none(), "the walk goes on after a recount");
}

mod migration;
