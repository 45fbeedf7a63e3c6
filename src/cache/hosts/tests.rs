//! Each host's accounts in the directory: published, read, folded when the host is gone.

use super::*;
use std::time::Duration;

/// Two hosts of one directory: two ledgers (each in its own memory), one directory.
fn two_hosts() -> (tempfile::TempDir, Ledger, Ledger) {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("cache");
    std::fs::create_dir(&dir).unwrap();
    let a = Ledger::open_at(&root.path().join("a.ledger")).unwrap();
    let b = Ledger::open_at(&root.path().join("b.ledger")).unwrap();
    assert_ne!(a.host_id(), b.host_id());
    (root, a, b)
}

#[test]
fn each_host_counts_what_every_host_did() {
    let (root, a, b) = two_hosts();
    let dir = root.path().join("cache");
    a.add(3, 1000, 1);
    a.count(Counter::Compiles, 2);
    b.add(3, 500, 1);
    b.add(7, 200, 1);
    b.count(Counter::Compiles, 5);
    publish(&dir, &a, true);
    publish(&dir, &b, true);
    assert!(step(&dir, &a, Step::Now) && step(&dir, &b, Step::Now));
    for l in [&a, &b] {
        assert_eq!((l.entries(), l.bytes()), (3, 1700));
        assert_eq!(l.shard_bytes(3), 1500);
        assert_eq!(l.counter(Counter::Compiles), 7);
        assert_eq!(l.other_hosts(), 1);
    }
    // Host b removes what host a wrote: its own words go below zero, the sum is right.
    b.add(3, -1000, -1);
    publish(&dir, &b, true);
    step(&dir, &a, Step::Now);
    assert_eq!((a.entries(), a.bytes()), (2, 700));
    // A count set by listing a shard is what the other hosts do not account for.
    a.set_shard(3, 500, 1);
    assert_eq!(a.shard_bytes(3), 500);
    publish(&dir, &a, true);
    step(&dir, &b, Step::Now);
    assert_eq!((b.entries(), b.bytes()), (2, 700));
}

#[test]
fn the_zero_is_every_hosts_counts() {
    let (root, a, b) = two_hosts();
    let dir = root.path().join("cache");
    a.count(Counter::Requests, 4);
    b.count(Counter::Requests, 6);
    publish(&dir, &b, true);
    step(&dir, &a, Step::Fresh);
    let requests = |l: &Ledger, zero| {
        counters(&dir, l, zero)
            .into_iter()
            .find(|(c, _)| *c == Counter::Requests)
            .unwrap()
            .1
    };
    assert_eq!(requests(&a, true), 10);
    assert_eq!(requests(&a, false), 0);
    b.count(Counter::Requests, 1);
    publish(&dir, &b, true);
    step(&dir, &a, Step::Fresh);
    assert_eq!(requests(&a, false), 1);
}

#[test]
fn files_that_are_not_whole_are_not_read() {
    let (root, a, b) = two_hosts();
    let dir = root.path().join("cache");
    b.count(Counter::Compiles, 5);
    publish(&dir, &b, true);
    let hosts = dir.join(DIR);
    let good = hosts.join(file_name(b.host_id()));
    let bytes = std::fs::read(&good).unwrap();
    // Torn, flipped, too long, renamed onto another id, a link, a directory.
    std::fs::write(hosts.join(file_name(11)), &bytes[..100]).unwrap();
    let mut flipped = bytes.clone();
    flipped[40] ^= 1;
    std::fs::write(hosts.join(file_name(12)), flipped).unwrap();
    std::fs::write(hosts.join(file_name(13)), [&bytes[..], b"x"].concat()).unwrap();
    std::fs::write(hosts.join(file_name(14)), &bytes).unwrap();
    std::os::unix::fs::symlink(&good, hosts.join(file_name(15))).unwrap();
    std::fs::create_dir(hosts.join(file_name(16))).unwrap();
    assert!(step(&dir, &a, Step::Now));
    assert_eq!(a.counter(Counter::Compiles), 5);
    assert_eq!(a.other_hosts(), 1);
}

/// Files of hosts `ids`, each a host that compiled once (shaped as `model`'s).
fn one_compile_each(dir: &Path, model: &Ledger, ids: std::ops::Range<u64>) {
    let mut words = model.own_words();
    words[2 * crate::cache::ledger::SHARDS + Counter::Compiles as usize] = 1;
    for id in ids {
        write(dir, id, &words).unwrap();
    }
}

#[test]
fn a_pass_over_many_hosts_is_a_step_per_write() {
    let (root, a, b) = two_hosts();
    let dir = root.path().join("cache");
    let hosts = STEP_HOSTS * 2 + 5;
    one_compile_each(&dir, &b, 2..hosts as u64 + 2);
    let mut steps = 1;
    while !step(&dir, &a, Step::Now) {
        steps += 1;
    }
    assert_eq!(steps, 3);
    assert_eq!(a.counter(Counter::Compiles), hosts as u64);
    assert_eq!(a.other_hosts(), hosts as u64);
}

#[test]
fn a_host_that_lost_its_ledger_goes_on_from_its_file() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("cache");
    std::fs::create_dir(&dir).unwrap();
    let at = root.path().join("host.ledger");
    let first = Ledger::open_at(&at).unwrap();
    first.count(Counter::Compiles, 5);
    first.add(9, 300, 1);
    publish(&dir, &first, true);
    let id = first.host_id();
    drop(first);
    std::fs::remove_file(&at).unwrap(); // /dev/shm purged
    let again = Ledger::open_at(&at).unwrap();
    assert_eq!(
        again.host_id(),
        id,
        "the same memory of the same machine: the same host"
    );
    assert!(step(&dir, &again, Step::Now));
    assert_eq!(again.counter(Counter::Compiles), 5);
    assert_eq!((again.entries(), again.bytes()), (1, 300));
    assert_eq!(again.other_hosts(), 0, "its own file is not another host's");
}

#[test]
#[ignore = "a measurement: cargo test --release -- --ignored --nocapture cost"]
fn what_publishing_and_a_step_cost() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("cache");
    std::fs::create_dir(&dir).unwrap();
    let l = Ledger::open_at(&root.path().join("h.ledger")).unwrap();
    let n = 2000;
    let t = std::time::Instant::now();
    for _ in 0..n {
        publish(&dir, &l, true);
    }
    let publish_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    let t = std::time::Instant::now();
    for _ in 0..n {
        step(&dir, &l, Step::Now);
    }
    let step_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    println!("publish {publish_us:.1} us, step {step_us:.1} us");
    // With a thousand other hosts' files: a write's step, a fresh pass (the upkeep lock's
    // holder), and a fold of 64 of them gone for a day.
    let words = l.own_words();
    for id in 2..1002u64 {
        write(&dir, id, &words).unwrap();
    }
    let t = std::time::Instant::now();
    for _ in 0..100 {
        step(&dir, &l, Step::Now);
    }
    let step_ms = t.elapsed().as_secs_f64() * 1e3 / 100.0;
    let t = std::time::Instant::now();
    for _ in 0..20 {
        step(&dir, &l, Step::Fresh);
    }
    let fresh_ms = t.elapsed().as_secs_f64() * 1e3 / 20.0;
    let hosts = dir.join(DIR);
    for id in 2..66 {
        age_id(&dir, id, fold::FOLD_AFTER * 2);
    }
    let t = std::time::Instant::now();
    assert_eq!(fold::fold(&hosts, l.host_id()).unwrap(), 64);
    let fold_ms = t.elapsed().as_secs_f64() * 1e3;
    println!(
        "1000 hosts: step {step_ms:.2} ms, fresh pass {fresh_ms:.1} ms, fold of 64 {fold_ms:.1} ms"
    );
}

/// Host `l`'s file, last written `ago`.
fn age(dir: &Path, l: &Ledger, ago: Duration) {
    age_id(dir, l.host_id(), ago);
}

/// Host `id`'s file, last written `ago`.
fn age_id(dir: &Path, id: u64, ago: Duration) {
    let path = dir.join(DIR).join(file_name(id));
    let file = std::fs::File::options().write(true).open(path).unwrap();
    file.set_modified(SystemTime::now() - ago).unwrap();
}

fn hosts3() -> (tempfile::TempDir, PathBuf, [Ledger; 3]) {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("cache");
    std::fs::create_dir(&dir).unwrap();
    let open = |n: &str| Ledger::open_at(&root.path().join(n)).unwrap();
    let hosts = [open("a"), open("b"), open("c")];
    for (i, l) in hosts.iter().enumerate() {
        l.add(i + 1, 100 << i, 1);
        l.count(Counter::Compiles, 1 << i);
        publish(&dir, l, true);
    }
    (root, dir, hosts)
}

/// What host `l` sees after a pass begun now: entries, bytes, compiles, other hosts.
fn seen(dir: &Path, l: &Ledger) -> (u64, u64, u64, u64) {
    assert!(step(dir, l, Step::Fresh));
    let compiles = l.counter(Counter::Compiles);
    (l.entries(), l.bytes(), compiles, l.other_hosts())
}

/// A host's file not written for a day is folded: every host's sums stay what they were,
/// the file is gone, and the fold is read by every pass. The host, back, goes on from
/// zero, and what it does then is counted once.
#[test]
fn the_files_of_hosts_gone_are_folded_and_counted_once() {
    let (_root, dir, [a, b, c]) = hosts3();
    age(&dir, &b, fold::FOLD_AFTER + Duration::from_secs(60));
    age(&dir, &c, fold::FOLD_AFTER - Duration::from_secs(3600));
    assert_eq!(seen(&dir, &a), (3, 700, 7, 2));
    fold_gone(&dir, &a);
    let hosts = dir.join(DIR);
    assert!(
        !hosts.join(file_name(b.host_id())).exists(),
        "gone for a day"
    );
    assert!(
        hosts.join(file_name(c.host_id())).exists(),
        "written within a day"
    );
    assert!(hosts.join(fold::FOLDED).exists());
    assert_eq!(seen(&dir, &a), (3, 700, 7, 1), "the fold counts b");
    // b comes back: what it did is in the fold (taken out of its own words before its
    // first pass reads the fold), what it does now in its new file.
    assert_eq!(seen(&dir, &b), (3, 700, 7, 2));
    b.add(2, 50, 1);
    b.count(Counter::Compiles, 8);
    publish(&dir, &b, true);
    assert_eq!(seen(&dir, &a), (4, 750, 15, 2));
    assert_eq!(seen(&dir, &b), (4, 750, 15, 2));
    let own = b.own_words();
    assert_eq!(
        (own[2], own[256 + 2]),
        (50, 1),
        "b's own: what it did since it came back"
    );
    // Folding again takes nothing: every file was written within the day.
    fold_gone(&dir, &a);
    assert_eq!(seen(&dir, &c), (4, 750, 15, 2));
}

/// A fold whose holder was killed is finished once by the next: killed before it wrote
/// the fold (the file renamed, not taken), the next takes it; killed after (taken, not
/// removed), the next removes it without adding it again.
#[test]
fn a_fold_cut_short_is_finished_once() {
    let (_root, dir, [a, b, c]) = hosts3();
    let hosts = dir.join(DIR);
    let folding = |l: &Ledger| hosts.join(format!("{:016x}.folding", l.host_id()));
    // Killed before it wrote the fold: b renamed, nothing counted it since.
    std::fs::rename(hosts.join(file_name(b.host_id())), folding(&b)).unwrap();
    assert_eq!(seen(&dir, &a), (2, 500, 5, 1));
    fold_gone(&dir, &a);
    assert!(!folding(&b).exists());
    assert_eq!(seen(&dir, &a), (3, 700, 7, 1));
    // Killed after it wrote the fold that took c: c's file left under its fold name.
    let bytes = std::fs::read(hosts.join(file_name(c.host_id()))).unwrap();
    age(&dir, &c, fold::FOLD_AFTER * 2);
    fold_gone(&dir, &a);
    std::fs::write(folding(&c), bytes).unwrap();
    assert_eq!(seen(&dir, &a), (3, 700, 7, 0));
    fold_gone(&dir, &a);
    assert!(!folding(&c).exists());
    assert_eq!(seen(&dir, &a), (3, 700, 7, 0), "c counted once");
}

/// A fold names what it took only until the next fold: a host folded, back, then gone
/// again is taken again, whether the fold that renames its new file ends or is killed.
#[test]
fn a_host_folded_twice_is_counted_once_each_time() {
    let (_root, dir, [a, b, _c]) = hosts3();
    let hosts = dir.join(DIR);
    age(&dir, &b, fold::FOLD_AFTER * 2);
    fold_gone(&dir, &a);
    b.add(2, 50, 1);
    publish(&dir, &b, true); // back: a new file
    fold_gone(&dir, &a); // takes nothing, and names nothing any more
    assert_eq!(fold::read_fold(&hosts).unwrap().1, Vec::<u64>::new());
    // Killed after it renamed b's new file: the next fold takes it.
    let folding = hosts.join(format!("{:016x}.folding", b.host_id()));
    std::fs::rename(hosts.join(file_name(b.host_id())), &folding).unwrap();
    fold_gone(&dir, &a);
    assert!(!folding.exists());
    assert_eq!(seen(&dir, &a), (4, 750, 7, 1));
}

/// A host whose ledger was lost goes on from its file; folded after that, it still takes
/// out only what its file said.
#[test]
fn a_host_seeded_from_its_file_then_folded_counts_once() {
    let (root, dir, [a, b, _c]) = hosts3();
    let at = root.path().join("b");
    let id = b.host_id();
    drop(b);
    std::fs::remove_file(&at).unwrap();
    let b = Ledger::open_at(&at).unwrap();
    assert_eq!(b.host_id(), id);
    assert_eq!(seen(&dir, &b), (3, 700, 7, 2), "seeded from its file");
    age(&dir, &b, fold::FOLD_AFTER * 2);
    fold_gone(&dir, &a);
    b.add(2, 50, 1);
    publish(&dir, &b, true);
    assert_eq!(seen(&dir, &a), (4, 750, 7, 2));
}

/// A file that is never whole, of a host gone for a day, is folded as no host's (its
/// words cannot be read) and removed; the rest of the fold goes on.
#[test]
fn a_torn_file_does_not_stop_a_fold() {
    let (_root, dir, [a, b, c]) = hosts3();
    let at = dir.join(DIR).join(file_name(b.host_id()));
    let mut torn = std::fs::read(&at).unwrap();
    torn[100] ^= 1;
    std::fs::write(&at, &torn).unwrap();
    age(&dir, &b, fold::FOLD_AFTER * 2);
    age(&dir, &c, fold::FOLD_AFTER * 2);
    fold_gone(&dir, &a);
    assert!(!at.exists());
    assert!(!dir.join(DIR).join(file_name(c.host_id())).exists());
    assert_eq!(
        seen(&dir, &a),
        (2, 500, 5, 0),
        "c folded, b's words never read"
    );
}

/// A fold takes at most 64 files, each once (a file renamed as the directory is read is
/// not taken again under its new name), and the next fold the rest.
#[test]
fn a_fold_takes_64_files_at_most_each_once() {
    let (root, a, b) = two_hosts();
    let dir = root.path().join("cache");
    let hosts = dir.join(DIR);
    one_compile_each(&dir, &b, 2..102);
    for id in 2..102 {
        age_id(&dir, id, fold::FOLD_AFTER * 2);
    }
    assert_eq!(fold::fold(&hosts, a.host_id()).unwrap(), 64);
    assert!(step(&dir, &a, Step::Fresh));
    assert_eq!((a.counter(Counter::Compiles), a.other_hosts()), (100, 36));
    assert_eq!(fold::fold(&hosts, a.host_id()).unwrap(), 36);
    assert!(step(&dir, &a, Step::Fresh));
    assert_eq!((a.counter(Counter::Compiles), a.other_hosts()), (100, 0));
}
