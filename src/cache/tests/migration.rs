//! The last layouts' entries, moved into this one: never lost, never over a newer one.

use super::*;

/// Write `key`'s entry as a last layout held it (`zebin-v1` flat, `zebin-v2` by the key's
/// first hex digit); its size.
fn old_entry(base: &Path, layout: &str, key: &str, binary: &[u8]) -> u64 {
    let bytes = encode(key, &"old".to_string(), binary).unwrap();
    let mut dir = base.join(layout);
    if layout == "zebin-v2" {
        dir = dir.join(&key[..1]);
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .unwrap();
    std::fs::write(dir.join(format!("{key}.zeentry")), &bytes).unwrap();
    bytes.len() as u64
}

#[test]
fn entries_of_the_last_layouts_are_moved_in_and_served() {
    for layout in ["zebin-v1", "zebin-v2"] {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(Some(dir.path()));
        let key = key(&[layout.as_bytes()]);
        let len = old_entry(dir.path(), layout, &key, b"old binary");
        match cache.get::<String>(&key) {
            Lookup::Hit(m, b) => {
                assert_eq!((m.as_str(), b.as_slice()), ("old", &b"old binary"[..]))
            }
            _ => panic!("the {layout} entry was not served"),
        }
        assert_eq!(cache.usage(), (1, len));
        assert!(!dir.path().join(layout).exists(), "{layout} is left");
    }
}

/// Many entries of the last layout: each process's first use and each write move a slice
/// (no request moves them all), a miss takes its own key's entry at once, and every entry
/// ends up here, counted once, the old directory gone.
#[test]
fn a_large_last_layout_is_moved_in_slices_never_lost() {
    let dir = tempfile::tempdir().unwrap();
    let n = 3 * migrate::SLICE as u64;
    let keys: Vec<String> = (0..n).map(|i| key(&[&i.to_le_bytes()])).collect();
    let mut bytes = 0;
    for k in &keys {
        bytes += old_entry(dir.path(), "zebin-v2", k, &[3u8; 100]);
    }
    // The ledger a last release kept beside its entries (on ext4, tmpfs), named `ledger`.
    std::fs::write(dir.path().join("zebin-v2").join("ledger"), [0u8; 8192]).unwrap();
    let cache = Cache::open(Some(dir.path()));
    let last = keys.last().unwrap();
    // The first lookup moves one slice, and takes its own entry whatever the slice held.
    assert!(matches!(cache.get::<String>(last), Lookup::Hit(..)));
    let here = on_disk(&cache).0;
    assert!((migrate::SLICE as u64..=migrate::SLICE as u64 + 1).contains(&here));
    assert!(cache.put("new", &"m".to_string(), b"new").is_none()); // one more slice
    assert!(on_disk(&cache).0 > here + migrate::SLICE as u64 - 2);
    assert!(dir.path().join("zebin-v2").exists());
    for k in keys.iter().step_by(97) {
        assert!(
            matches!(cache.get::<String>(k), Lookup::Hit(..)),
            "{k} lost"
        );
    }
    assert!(cache.recount()); // moves what is left
    let new = std::fs::metadata(cache.path("new")).unwrap().len();
    assert_eq!(cache.usage(), (n + 1, bytes + new));
    assert_eq!(on_disk(&cache), (n + 1, bytes + new));
    assert!(!dir.path().join("zebin-v2").exists());
}

/// A process killed between linking an old entry in and unlinking its old name leaves it
/// under both; it is dropped from the old layout, never counted twice, and an entry
/// written here since is never replaced by an old one.
#[test]
fn an_old_entry_never_replaces_one_written_here() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(Some(dir.path()));
    let (a, b) = (key(&[b"a"]), key(&[b"b"]));
    old_entry(dir.path(), "zebin-v2", &a, b"old a");
    old_entry(dir.path(), "zebin-v1", &b, b"old b");
    std::fs::create_dir_all(cache.shard_dir(&a)).unwrap();
    let v2 = dir.path().join("zebin-v2").join(&a[..1]);
    std::fs::hard_link(v2.join(format!("{a}.zeentry")), cache.path(&a)).unwrap();
    assert!(cache.put(&b, &"new".to_string(), b"new b").is_none());
    assert!(cache.recount());
    assert_eq!(on_disk(&cache), cache.usage());
    assert_eq!(cache.usage().0, 2);
    match cache.get::<String>(&b) {
        Lookup::Hit(m, _) => assert_eq!(m, "new"),
        _ => panic!("the entry written here was lost"),
    }
    assert!(!dir.path().join("zebin-v1").exists() && !dir.path().join("zebin-v2").exists());
}

/// An old entry of this user's that cannot come into this layout (here: larger than any
/// entry may be) is removed, not left on disk uncounted for ever.
#[test]
fn an_old_entry_that_cannot_come_in_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(Some(dir.path()));
    assert!(cache.put("first", &"m".to_string(), b"x").is_none()); // accounts known
    let big = key(&[b"big"]);
    old_entry(dir.path(), "zebin-v1", &big, b"");
    let old = dir.path().join("zebin-v1").join(format!("{big}.zeentry"));
    let file = std::fs::OpenOptions::new().write(true).open(&old).unwrap();
    file.set_len(MAX_ENTRY_BYTES + 1).unwrap(); // sparse: no disk used
    assert_eq!(
        migrate::move_one(&old, &cache.path(&big)),
        migrate::Moved::Dropped
    );
    assert!(!old.exists() && !cache.path(&big).exists());
    assert_eq!(cache.usage(), on_disk(&cache));
}

/// An old entry reached twice (its directory swapped for a link to this layout's shard) is
/// never unlinked as if it were a second name; one left under two names by a process
/// killed between link and unlink keeps its new name, and a recount counts it once.
#[test]
fn moving_an_old_entry_never_loses_it_and_counts_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Cache::open(Some(dir.path()));
    assert!(cache.put("first", &"m".to_string(), b"x").is_none()); // accounts known
    let a = key(&[b"a"]);
    assert!(cache.put(&a, &"m".to_string(), b"a").is_none());
    let alias = dir.path().join("alias");
    std::os::unix::fs::symlink(cache.shard_dir(&a), &alias).unwrap();
    let from = alias.join(format!("{a}.zeentry"));
    assert_eq!(
        migrate::move_one(&from, &cache.path(&a)),
        migrate::Moved::Left
    );
    assert!(cache.path(&a).exists());
    // Killed between link and unlink: the v2 name and this layout's name, one file.
    let b = key(&[b"b"]);
    old_entry(dir.path(), "zebin-v2", &b, b"old b");
    std::fs::create_dir_all(cache.shard_dir(&b)).unwrap();
    let v2 = dir.path().join("zebin-v2").join(&b[..1]);
    std::fs::hard_link(v2.join(format!("{b}.zeentry")), cache.path(&b)).unwrap();
    let ledger = cache.ledger().unwrap();
    assert!(!migrate::slice(cache.dir(), &ledger, migrate::SLICE));
    assert!(!v2.exists() && cache.path(&b).exists());
    assert!(cache.recount());
    assert_eq!(cache.usage(), on_disk(&cache));
    assert_eq!(cache.usage().0, 3);
}
