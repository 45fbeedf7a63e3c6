//! The claims against real files, locks and threads.

use super::*;
use std::sync::atomic::AtomicUsize;

const KEY: &str = "00ab";

/// The cores' word where slots are not counted: build as before.
fn go(_: Duration) -> CoreTurn {
    CoreTurn::Go
}

/// The claims of a fresh cache directory, with `KEY` taken (the directory lasts while it
/// is held).
fn held() -> (tempfile::TempDir, Claims, Claim) {
    let dir = tempfile::tempdir().unwrap();
    let claims = Claims::of(dir.path());
    let Taken::Mine(claim) = claims.take(KEY) else {
        panic!("a free key is not taken")
    };
    (dir, claims, claim)
}

#[test]
fn one_holder_per_key_and_let_go_removes_the_file() {
    let (dir, claims, claim) = held();
    assert!(matches!(claims.take(KEY), Taken::HeldHere));
    assert!(matches!(claims.take("00ac"), Taken::Mine(_)));
    drop(claim);
    assert!(!dir.path().join("claims").join(KEY).exists());
    assert!(matches!(claims.take(KEY), Taken::Mine(_)));
}

#[test]
fn a_key_that_is_not_hex_is_no_claim() {
    let dir = tempfile::tempdir().unwrap();
    let claims = Claims::of(dir.path());
    for bad in ["", "../x", "a/b", "zz", &"a".repeat(129)] {
        assert!(matches!(claims.take(bad), Taken::Unavailable(_)), "{bad:?}");
    }
}

#[test]
fn a_waiter_is_answered_when_the_holder_keeps_its_entry() {
    let (_dir, claims, claim) = held();
    let kept = Arc::new(AtomicBool::new(false));
    let waiter = {
        let (claims, kept) = (claims.clone(), kept.clone());
        std::thread::spawn(move || {
            let never = AtomicBool::new(false);
            match claims.wait(KEY, (None, &never), (&|| false, &go), || {
                kept.load(Ordering::SeqCst).then_some(7)
            }) {
                Waited::Answered(v, _, _) => v,
                _ => panic!("not answered"),
            }
        })
    };
    kept.store(true, Ordering::SeqCst);
    drop(claim);
    assert_eq!(waiter.join().unwrap(), 7);
}

#[test]
fn a_waiter_takes_the_claim_when_the_holder_keeps_nothing() {
    let (_dir, claims, claim) = held();
    let waiter = {
        let claims = claims.clone();
        std::thread::spawn(move || {
            let never = AtomicBool::new(false);
            matches!(
                claims.wait(KEY, (None, &never), (&|| false, &go), || None::<()>),
                Waited::Mine(_, None, None)
            )
        })
    };
    drop(claim);
    assert!(waiter.join().unwrap(), "the waiter did not build");
}

#[test]
fn a_wait_ends_on_cancel_and_on_its_bound() {
    let (_dir, claims, _claim) = held();
    let cancel = AtomicBool::new(true);
    assert!(matches!(
        claims.wait(KEY, (None, &cancel), (&|| false, &go), || None::<()>),
        Waited::Cancelled
    ));
    let never = AtomicBool::new(false);
    let bound = Some(Duration::from_millis(50));
    assert!(matches!(
        claims.wait(KEY, (bound, &never), (&|| false, &go), || None::<()>),
        Waited::Alone(_)
    ));
}

/// On a host whose cores all run compilers a free key is not claimed: the waiter looks
/// until another keeps it, and claims it once the cores say go.
#[test]
fn without_a_core_a_free_key_is_waited_for_not_claimed() {
    let dir = tempfile::tempdir().unwrap();
    let claims = Claims::of(dir.path());
    let never = AtomicBool::new(false);
    let (looks, file) = (AtomicUsize::new(0), dir.path().join("claims").join(KEY));
    let full = |_: Duration| CoreTurn::Wait;
    let kept = || {
        assert!(!file.exists(), "claimed without a core");
        (looks.fetch_add(1, Ordering::SeqCst) == 3).then_some(9)
    };
    // With other work first (a batch's queue), it steps aside at the first look.
    let aside = claims.wait(KEY, (None, &never), (&|| true, &full), || None::<()>);
    assert!(matches!(aside, Waited::SteppedAside));
    let waited = claims.wait(KEY, (None, &never), (&|| false, &full), kept);
    assert!(matches!(waited, Waited::Answered(9, _, _)));
    // Told to go once it has waited (`XPU_ZEBIN_CORE_WAIT_SECONDS`, here 30 ms): it claims and builds.
    let after = |waited: Duration| match waited >= Duration::from_millis(30) {
        true => CoreTurn::Go,
        false => CoreTurn::Wait,
    };
    let waited = claims.wait(KEY, (None, &never), (&|| false, &after), || None::<()>);
    assert!(matches!(waited, Waited::Mine(_, None, Some(w)) if w >= Duration::from_millis(30)));
    // Its own bound ends a wait for a core too: it claims the key and builds.
    let bound = Some(Duration::from_millis(30));
    let waited = claims.wait("00ac", (bound, &never), (&|| false, &full), || None::<()>);
    assert!(
        matches!(waited, Waited::Mine(_, None, Some(_))),
        "a full host's wait did not end"
    );
}

/// A key already claimed is looked at, not waited for as a core: its holder is seen at the
/// first look (a waiter with other work steps aside at once) and no core is asked.
#[test]
fn a_claimed_key_is_waited_for_as_held_whatever_the_cores() {
    let (_dir, claims, _claim) = held();
    let (asked, never) = (AtomicBool::new(false), AtomicBool::new(false));
    let full = |_: Duration| {
        asked.store(true, Ordering::SeqCst);
        CoreTurn::Wait
    };
    let waited = claims.wait(KEY, (None, &never), (&|| true, &full), || None::<()>);
    assert!(matches!(waited, Waited::SteppedAside));
    assert!(
        !asked.load(Ordering::SeqCst),
        "a core was asked for a held key"
    );
}

#[test]
fn a_claim_says_when_its_holder_took_it() {
    let before = SystemTime::now();
    let (dir, _claims, claim) = held();
    let file = File::open(dir.path().join("claims").join(KEY)).unwrap();
    let took = taken_at(&file).expect("the claim says nothing");
    // Microseconds: at most one short of the moment before it was taken.
    assert!(took + Duration::from_micros(1) >= before && took <= SystemTime::now());
    drop(claim);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Whatever a claim's file holds (another host's writer, a crash mid-write): no panic,
    /// a time only where it holds a number of microseconds.
    #[test]
    fn any_claim_file_is_read_or_left(text in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(KEY);
        std::fs::write(&path, &text).unwrap();
        let read = taken_at(&File::open(&path).unwrap());
        let number = std::str::from_utf8(&text[..text.len().min(24)])
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok());
        proptest::prop_assert_eq!(read.is_some(), number.is_some());
    }

    /// Any key a caller passes: no panic, a claim only for a key that names a file
    /// (hex digits), and nothing made outside the claims directory.
    #[test]
    fn any_key_is_taken_or_refused_and_stays_inside(key in ".{0,40}|[0-9a-f]{1,140}") {
        let dir = tempfile::tempdir().unwrap();
        let claims = Claims::of(dir.path());
        let plain = !key.is_empty()
            && key.len() <= 128
            && key.bytes().all(|b| b.is_ascii_hexdigit());
        match claims.take(&key) {
            Taken::Mine(claim) => {
                proptest::prop_assert!(plain, "{key:?} was claimed");
                drop(claim);
            }
            Taken::Unavailable(_) => proptest::prop_assert!(!plain, "{key:?} refused"),
            Taken::HeldHere | Taken::HeldThere(..) => {
                proptest::prop_assert!(false, "{key:?} held by nobody")
            }
        }
        let made: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten()
            .map(|e| e.file_name()).collect();
        proptest::prop_assert!(made.iter().all(|n| n == "claims"), "{made:?}");
    }
}

#[test]
fn anything_planted_at_a_claims_name_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let claims = Claims::of(dir.path());
    claims.ready().unwrap();
    std::os::unix::fs::symlink("/etc/passwd", dir.path().join("claims").join(KEY)).unwrap();
    assert!(matches!(claims.take(KEY), Taken::Mine(_)));
    assert!(std::fs::metadata("/etc/passwd").is_ok());
}

#[test]
fn a_file_linked_at_a_claims_name_is_never_written() {
    let dir = tempfile::tempdir().unwrap();
    let claims = Claims::of(dir.path());
    claims.ready().unwrap();
    let elsewhere = dir.path().join("kept");
    std::fs::write(&elsewhere, b"not a claim's").unwrap();
    std::fs::hard_link(&elsewhere, dir.path().join("claims").join(KEY)).unwrap();
    let _claim = claims.take(KEY);
    assert_eq!(std::fs::read(&elsewhere).unwrap(), b"not a claim's");
}
