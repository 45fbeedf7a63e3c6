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

/// What a job may do with the batch around it: take a free core for a speculative build
/// (`may_speculate`: the batch's jobs and a twin each fit in the host's cores, or no
/// queued job waits for one), or step aside while another process
/// builds its key (`step_aside`: other jobs are queued, so N processes given one batch
/// split its builds instead of waiting on each other's).
pub struct Room<'a> {
    may_speculate: &'a (dyn Fn() -> bool + Sync),
    queue_empty: &'a (dyn Fn() -> bool + Sync),
    /// A job stepped aside once comes back in the last round, and waits.
    last_round: bool,
    stepped_aside: AtomicBool,
}

impl Room<'_> {
    /// The room of a request alone: every free core its own, nothing to step aside for.
    pub fn alone() -> Room<'static> {
        Room {
            may_speculate: &|| true,
            queue_empty: &|| true,
            last_round: true,
            stepped_aside: AtomicBool::new(false),
        }
    }

    /// Whether a free core may go to a speculative build: every job of the batch may have
    /// its twin within the host's cores (a build has at most one twin, so the batch never
    /// runs more compilers than cores, and a core a twin takes is never one a queued job
    /// needs: `jobs=1` on two cores builds as a loop of compiles does), or no queued job
    /// waits for it.
    pub fn may_speculate(&self) -> &(dyn Fn() -> bool + Sync) {
        self.may_speculate
    }

    /// Whether this job may step aside now (it then returns at once, and its answer is
    /// dropped: the job runs again after the queue); once asked and allowed, it has.
    pub fn step_aside(&self) -> bool {
        let may = !self.last_round && !(self.queue_empty)();
        if may {
            self.stepped_aside.store(true, Ordering::Relaxed);
        }
        may
    }
}

/// What a job that stepped aside answers: never seen, the batch drops it and runs the job
/// again after its queue.
pub fn stepped_aside() -> BuildError {
    BuildError::new(
        ErrorKind::Internal,
        "stepped aside, to run again after the queue",
    )
}

/// Run `work(item, room)` for every item with at most `jobs` at once, largest `cost`
/// first (the long builds start at once and the short ones fill in around them); results
/// in input order. `room` says whether a core that frees up may go to a running item's
/// speculative build (when every job may have a twin within the host's cores, or once no
/// queued item waits for it), and lets a job step aside
/// (its key built by another process): it runs again after the queue. Once `cancel` is
/// set, items not started get `failed(cancelled error)`; an item whose work panics gets
/// `failed(internal error)`, and the others go on. `on_done(index)` is called as each
/// finishes.
pub fn run<T: Sync, R: Send>(
    items: &[T],
    jobs: usize,
    cost: impl Fn(&T) -> usize,
    cancel: &AtomicBool,
    on_done: &(dyn Fn(usize) + Sync),
    work: impl Fn(&T, &Room<'_>) -> R + Sync,
    failed: impl Fn(BuildError) -> R + Sync,
) -> Vec<R> {
    let slots: Vec<Mutex<Option<R>>> = items.iter().map(|_| Mutex::new(None)).collect();
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(cost(&items[i])));
    let next = AtomicUsize::new(0);
    // Jobs that stepped aside: run again once the queue is empty (by the worker that put
    // one here, at the latest: it goes on looking before it stops), by their place in
    // `order`, largest first as well.
    let later = Mutex::new(std::collections::BinaryHeap::new());
    let queue_empty =
        || next.load(Ordering::Relaxed) >= items.len() && crate::sync::lock(&later).is_empty();
    let workers = jobs.max(1).min(items.len().max(1));
    let twins_fit = workers.saturating_mul(2) <= default_jobs();
    let may_speculate = || twins_fit || queue_empty();
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                let (n, last_round) = match n < order.len() {
                    true => (n, false),
                    false => match crate::sync::lock(&later).pop() {
                        Some(std::cmp::Reverse(n)) => (n, true),
                        None => break,
                    },
                };
                let Some(&i) = order.get(n) else { break };
                let room = Room {
                    may_speculate: &may_speculate,
                    queue_empty: &queue_empty,
                    last_round,
                    stepped_aside: AtomicBool::new(false),
                };
                let result = if cancel.load(Ordering::Relaxed) {
                    failed(BuildError::new(
                        ErrorKind::Cancelled,
                        "cancelled before it started",
                    ))
                } else {
                    crate::sync::catch("a batch job", || work(&items[i], &room))
                        .unwrap_or_else(&failed)
                };
                if room.stepped_aside.load(Ordering::Relaxed) {
                    crate::sync::lock(&later).push(std::cmp::Reverse(n));
                    continue;
                }
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
    fn a_job_that_steps_aside_runs_again_after_the_queue() {
        let items = [1u32, 2, 3, 4];
        let cancel = AtomicBool::new(false);
        let runs = Mutex::new(Vec::new());
        let results = run(
            &items,
            1,
            |_| 0,
            &cancel,
            &|_| {},
            |&i, room| {
                crate::sync::lock(&runs).push(i);
                if i == 1 && room.step_aside() {
                    return Err(BuildError::new(ErrorKind::Internal, "stepped aside"));
                }
                Ok(i)
            },
            Err,
        );
        assert!(results.iter().all(Result::is_ok));
        assert_eq!(*crate::sync::lock(&runs), [1, 2, 3, 4, 1]);
        // Alone, a job never steps aside.
        assert!(!Room::alone().step_aside());
    }

    #[test]
    fn a_twin_takes_a_core_only_the_batch_leaves_idle() {
        let cores = default_jobs();
        let cancel = AtomicBool::new(false);
        // One job at a time: a twin fits beside it, on a core the queue never takes.
        let items = [1u32, 2, 3];
        let may = run(
            &items,
            1,
            |_| 0,
            &cancel,
            &|_| {},
            |_, r| (r.may_speculate())(),
            |_| false,
        );
        assert_eq!(may, vec![cores > 1, cores > 1, true]);
        // As many jobs as cores (more than half: a twin each would not fit), one more
        // queued: the jobs started first keep their cores for it (each looks once every
        // job has started, and none ends before all looked).
        let items: Vec<usize> = (0..=cores).collect();
        let (started, looked) = (
            std::sync::Barrier::new(cores),
            std::sync::Barrier::new(cores),
        );
        let may = run(
            &items,
            cores,
            |&i| usize::MAX - i,
            &cancel,
            &|_| {},
            |&i, r| {
                if i == cores {
                    return (r.may_speculate())();
                }
                started.wait();
                let may = (r.may_speculate())();
                looked.wait();
                may
            },
            |_| false,
        );
        assert_eq!(may, (0..=cores).map(|i| i == cores).collect::<Vec<_>>());
    }

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
