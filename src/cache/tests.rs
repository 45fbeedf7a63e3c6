use super::*;

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
    bytes[MAGIC.len() + 6] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();
    assert!(matches!(cache.get::<String>("k"), Lookup::Corrupt(_)));
    assert!(!path.exists());
    // Eviction keeps the directory under its bound, by the ledger and on disk.
    for i in 0..10 {
        cache.put(&format!("e{i}"), &"m".to_string(), &[0u8; 3000]);
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
fn entries_of_the_last_layout_are_moved_in_and_served() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(Some(dir.path()));
    let bytes = encode("abc", &"old".to_string(), b"old binary").unwrap();
    let old = dir.path().join(OLD_LAYOUT);
    std::fs::DirBuilder::new().mode(0o700).create(&old).unwrap();
    std::fs::write(old.join("abc.zeentry"), &bytes).unwrap();
    match cache.get::<String>("abc") {
        Lookup::Hit(m, b) => {
            assert_eq!((m.as_str(), b.as_slice()), ("old", &b"old binary"[..]))
        }
        _ => panic!("the last layout's entry was not served"),
    }
    assert_eq!(cache.usage(), (1, bytes.len() as u64));
    assert!(!old.exists());
}

#[test]
fn an_entry_renamed_onto_another_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(Some(dir.path()));
    cache.put("a", &"meta a".to_string(), b"binary a");
    cache.put("b", &"meta b".to_string(), b"binary b");
    std::fs::rename(cache.path("a"), cache.path("b")).unwrap();
    assert!(matches!(cache.get::<String>("b"), Lookup::Corrupt(_)));
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
    // Over its bound (0): the shard is cleaned, and the dead writer's file with it.
    assert!(cache.put("k", &"meta".to_string(), b"binary").is_some());
    assert!(!abandoned.exists(), "a dead writer's temp file stays");
    assert!(writing.exists(), "a live writer's temp file was removed");
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
        assert!(cache
            .put(name, &"m".to_string(), &[i as u8; 1000])
            .is_none());
        let used = start + Duration::from_secs(i as u64 * 10);
        let file = std::fs::File::options().write(true).open(cache.path(name));
        file.unwrap().set_modified(used).unwrap();
    }
    let (_, bytes) = on_disk(&cache);
    let each = bytes / 10;
    assert!(matches!(cache.get::<String>("lru0"), Lookup::Hit(..))); // now the newest
                                                                     // Bounded at ten entries: the eleventh sets off a cleaning down to nine tenths.
    let cache = cache.with_max_bytes(bytes + each / 2);
    let note = cache.put("lru10", &"m".to_string(), &[10u8; 1000]);
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
    // Shard 0 holds ten entries used now, shard f ten used 100 s before.
    for (name, used) in (0..10)
        .map(|i| (format!("0tie{i}"), now))
        .chain((0..10).map(|i| (format!("fold{i}"), now - Duration::from_secs(100))))
    {
        assert!(cache.put(&name, &"m".to_string(), &[7u8; 1000]).is_none());
        let file = std::fs::File::options().write(true).open(cache.path(&name));
        file.unwrap().set_modified(used).unwrap();
    }
    let (_, bytes) = on_disk(&cache);
    let each = bytes / 20;
    let ledger = cache.ledger().unwrap();
    // Nine tenths of ten and a half entries: eleven go.
    assert_eq!(upkeep::clean(cache.dir(), &ledger, each * 21 / 2), 11);
    let kept = |prefix: &str| {
        (0..10)
            .filter(|i| cache.path(&format!("{prefix}{i}")).exists())
            .count()
    };
    assert_eq!((kept("fold"), kept("0tie")), (0, 9));
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
        assert!(cache.put(name, &"m".to_string(), &vec![1u8; len]).is_none());
        let file = std::fs::File::options().write(true).open(cache.path(name));
        file.unwrap().set_modified(used).unwrap();
        std::fs::metadata(cache.path(name)).unwrap().len()
    };
    let tie = (0..10).map(|i| put(&format!("0tie{i}"), 1000, now)).max();
    let (tie, older) = (tie.unwrap(), put("fold", 10, old));
    let (_, total) = on_disk(&cache);
    // Half a tied entry more than the older one must go: the older one, and one tied.
    let max = (total - older - tie / 2) * 10 / 9;
    let ledger = cache.ledger().unwrap();
    assert_eq!(upkeep::clean(cache.dir(), &ledger, max), 2);
    assert!(!cache.path("fold").exists());
    let tied = (0..10).filter(|i| cache.path(&format!("0tie{i}")).exists());
    assert_eq!(tied.count(), 9);
}
