//! Many independent jobs with bounded parallelism, results in input order, for every
//! backend's batch (`compile_many`, `compile_and_load_many`).

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
/// `cancel` is set, items not started get `cancelled()`. `on_done(index)` is called as
/// each finishes.
pub fn run<T: Sync, R: Send>(
    items: &[T],
    jobs: usize,
    cost: impl Fn(&T) -> usize,
    cancel: &AtomicBool,
    on_done: &(dyn Fn(usize) + Sync),
    work: impl Fn(&T, &(dyn Fn() -> bool + Sync)) -> R + Sync,
    cancelled: impl Fn() -> R + Sync,
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
                    cancelled()
                } else {
                    work(&items[i], &queue_empty)
                };
                *slots[i].lock().unwrap() = Some(result);
                on_done(i);
            });
        }
    });
    slots
        .into_iter()
        .map(|s| s.into_inner().unwrap().expect("every slot is filled"))
        .collect()
}
