//! Many independent jobs with bounded parallelism, results in input order, for every
//! backend's batch (`compile_many`, `compile_and_load_many`).

use crate::error::{BuildError, ErrorKind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Number of parallel jobs when none is given: the machine's cores.
pub fn default_jobs() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Run `work(item, may_speculate)` for every item with at most `jobs` at once, largest
/// `cost` first (the long builds start at once and the short ones fill in around them);
/// results in input order. `may_speculate()` says whether a core that frees up may go to
/// a running item's speculative build: only once no queued item waits for it. Once
/// `cancel` is set, items not started get `failed(cancelled error)`; an item whose work
/// panics gets `failed(internal error)`, and the others go on. `on_done(index)` is called
/// as each finishes.
pub fn run<T: Sync, R: Send>(
    items: &[T],
    jobs: usize,
    cost: impl Fn(&T) -> usize,
    cancel: &AtomicBool,
    on_done: &(dyn Fn(usize) + Sync),
    work: impl Fn(&T, &(dyn Fn() -> bool + Sync)) -> R + Sync,
    failed: impl Fn(BuildError) -> R + Sync,
) -> Vec<R> {
    let slots: Vec<Mutex<Option<R>>> = items.iter().map(|_| Mutex::new(None)).collect();
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(cost(&items[i])));
    let next = AtomicUsize::new(0);
    let queue_empty = || next.load(Ordering::Relaxed) >= items.len();
    let workers = jobs.max(1).min(items.len().max(1));
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                let Some(&i) = order.get(n) else {
                    break;
                };
                let result = if cancel.load(Ordering::Relaxed) {
                    failed(BuildError::new(
                        ErrorKind::Cancelled,
                        "cancelled before it started",
                    ))
                } else {
                    crate::sync::catch("a batch job", || work(&items[i], &queue_empty))
                        .unwrap_or_else(&failed)
                };
                *crate::sync::lock(&slots[i]) = Some(result);
                let _ = crate::sync::catch("a progress callback", || on_done(i));
            });
        }
    });
    slots
        .into_iter()
        .map(|s| {
            s.into_inner()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .unwrap_or_else(|| {
                    failed(BuildError::new(
                        ErrorKind::Internal,
                        "a batch job left no result",
                    ))
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_job_fails_in_its_slot_and_the_others_finish() {
        let items = [1u32, 2, 3, 4];
        let cancel = AtomicBool::new(false);
        let results = run(
            &items,
            2,
            |_| 0,
            &cancel,
            &|_| {},
            |&i, _| {
                if i == 3 {
                    panic!("job {i} broke")
                }
                Ok(i * 10)
            },
            Err,
        );
        assert_eq!(results[0].as_ref().ok(), Some(&10));
        assert_eq!(results[3].as_ref().ok(), Some(&40));
        let e = results[2].as_ref().unwrap_err();
        assert_eq!(e.kind, ErrorKind::Internal);
        assert!(e.message.contains("job 3 broke"));
    }
}
