//! Spinning between operators: while a CPU instance runs a plan, its pool's other threads spin
//! (taking any work its operators split off) instead of sleeping, as onnxruntime's intra-op
//! threads do by default. Spinning stays inside the instance's thread budget and stops where it
//! would take a core from other work. `COTENANT_SPIN=0` turns it off.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Runs `f` on `pool` (inline without one) as one scope of a backend of `threads` threads whose
/// running scopes `scopes` counts: with spinners when it is the pool's only scope and spinning
/// pays, plainly otherwise.
pub(super) fn run_scope(
    pool: Option<&rayon::ThreadPool>,
    threads: usize,
    scopes: &AtomicUsize,
    f: &mut (dyn FnMut() + Send),
) {
    // A scope inside another (a batch lane's) runs on threads already counted.
    let _busy = rayon::current_thread_index()
        .is_none()
        .then(|| Count::enter(&BUSY, threads));
    match pool {
        Some(p) => {
            let scope = Count::enter(scopes, 1);
            match scope.before == 0 && spinning_allowed() && cores_free() {
                true => p.install(|| with_spinners(threads, &Arc::default(), &cores_free, f)),
                false => p.install(f),
            }
        }
        None => f(),
    }
}

/// Whether the deployment allows spinning: yes unless `COTENANT_SPIN=0`, as onnxruntime spins
/// its intra-op threads by default. Spinning stays inside the instance's own thread budget and
/// while its plan runs, and [`cores_free`] stops it where it would take a core from other work;
/// `COTENANT_SPIN=0` is for deployments that want no spinning at all.
fn spinning_allowed() -> bool {
    static ALLOWED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ALLOWED.get_or_init(|| std::env::var("COTENANT_SPIN").map_or(true, |v| v != "0"))
}

/// Threads of all the scopes now running in this process, every CPU backend's.
static BUSY: AtomicUsize = AtomicUsize::new(0);

/// Whether the running scopes leave a core free for each of their threads, and no spinner has
/// lately lost its core: only then does spinning pay. On shared cores a spinner takes time from
/// other work: another instance's here, another process's (other pods on the node), or this
/// pod's own CPU quota.
fn cores_free() -> bool {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    BUSY.load(Ordering::Relaxed) <= cores && micros() >= SPIN_AGAIN_AT.load(Ordering::Relaxed)
}

/// When spinning may start again (`micros()`), after a spinner found its core taken.
static SPIN_AGAIN_AT: AtomicU64 = AtomicU64::new(0);

/// A spinner that waited longer than this between two looks at the clock while idle was
/// descheduled: something else wants its core.
const PREEMPTED: Duration = Duration::from_micros(500);

/// How long spinning stays off after that.
const BACK_OFF: Duration = Duration::from_secs(1);

/// Microseconds since the first call.
fn micros() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_micros() as u64
}

/// Adds `n` to a counter until dropped (however the scope ends).
struct Count<'a> {
    counter: &'a AtomicUsize,
    n: usize,
    /// The count before this one entered.
    before: usize,
}

impl Count<'_> {
    fn enter(counter: &AtomicUsize, n: usize) -> Count<'_> {
        let before = counter.fetch_add(n, Ordering::AcqRel);
        Count { counter, n, before }
    }
}

impl Drop for Count<'_> {
    fn drop(&mut self) {
        self.counter.fetch_sub(self.n, Ordering::AcqRel);
    }
}

thread_local! {
    /// Whether this pool thread is already running a spinner (further down its stack).
    static SPINNING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Idle polls a spinner makes before it also yields its core to the OS scheduler each time.
const POLITE_AFTER: u32 = 1 << 12;

/// How long the thread running a scope on three or more threads waits for the others to take
/// up their spinners before it takes the rest back itself.
const CLAIM_WAIT: Duration = Duration::from_millis(1);

/// Runs `f` (on a thread of the pool, the only scope on it) while the pool's other threads
/// spin, taking any work its operators split off, instead of going to sleep between operators:
/// woken for each parallel operator, a sleeping thread costs a system call and its wake-up
/// latency, some tens of microseconds per operator (mobilenet_v2 at batch 1 runs ~60 of them
/// in ~5 ms). The spinning uses only the threads this instance was given, only while `f`
/// runs, and only while `pays()` (the cores are not all taken). `live` counts the spinners
/// running (they stop soon after `f` returns or panics, or `pays()` turns false).
///
/// No thread may take up a spinner while it holds unfinished work of `f` further down its
/// stack: the spinner would wait for `f` and `f` for that work. On two threads that cannot
/// happen: the spinner is the oldest job in the runner's queue, and the other thread can only
/// get work of `f` by stealing from that queue, oldest first. On more, a thread could steal
/// work of `f` from a spinning thread first; so there every spinner is taken up (or dropped)
/// before `f` starts, when no such work exists yet.
fn with_spinners(
    threads: usize,
    live: &Arc<AtomicUsize>,
    pays: &'static (dyn Fn() -> bool + Sync),
    f: &mut (dyn FnMut() + Send),
) {
    let done = Arc::new(AtomicBool::new(false));
    let claimed = Arc::new(AtomicUsize::new(0));
    let runner = rayon::current_thread_index();
    for _ in 1..threads {
        let (done, live, claimed) = (done.clone(), live.clone(), claimed.clone());
        rayon::spawn(move || {
            claimed.fetch_add(1, Ordering::AcqRel);
            // Never on the thread running `f` (it would wait for itself), and never nested.
            if rayon::current_thread_index() == runner || SPINNING.with(|s| s.replace(true)) {
                return;
            }
            live.fetch_add(1, Ordering::Relaxed);
            let (mut idle, mut looked) = (0u32, Instant::now());
            while !done.load(Ordering::Acquire) && pays() {
                if rayon::yield_now() == Some(rayon::Yield::Executed) {
                    (idle, looked) = (0, Instant::now());
                    continue;
                }
                idle = idle.saturating_add(1);
                if idle % 64 == 0 {
                    // Idle polls take well under a microsecond each: a long gap between two
                    // looks at the clock means this thread lost its core meanwhile.
                    let now = Instant::now();
                    if now - looked > PREEMPTED {
                        let again = micros() + BACK_OFF.as_micros() as u64;
                        SPIN_AGAIN_AT.fetch_max(again, Ordering::Relaxed);
                    }
                    looked = now;
                }
                if idle < POLITE_AFTER {
                    std::hint::spin_loop();
                } else {
                    // Long idle (a sequential stretch of `f`): let any other runnable thread
                    // on this core go first, as sleeping would have.
                    std::thread::yield_now();
                }
            }
            SPINNING.with(|s| s.set(false));
            live.fetch_sub(1, Ordering::Relaxed);
        });
    }
    let asked = Instant::now();
    while threads > 2 && claimed.load(Ordering::Acquire) < threads - 1 {
        if asked.elapsed() < CLAIM_WAIT {
            std::hint::spin_loop();
        } else {
            // The spinners still queued here are this thread's to run: each returns at once.
            rayon::yield_local();
        }
    }
    /// Stops the spinners however `f` ends.
    struct Stop(Arc<AtomicBool>);
    impl Drop for Stop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }
    let _stop = Stop(done);
    f();
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    /// Waits (up to a few seconds) until none of a scope's spinners runs; false if one still does.
    fn stops(live: &AtomicUsize) -> bool {
        let start = Instant::now();
        while live.load(Ordering::Relaxed) > 0 {
            if start.elapsed() > Duration::from_secs(5) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }

    /// Waits (up to a few seconds) until a spinner runs; false if none starts.
    fn starts(live: &AtomicUsize) -> bool {
        let start = Instant::now();
        while live.load(Ordering::Relaxed) == 0 {
            if start.elapsed() > Duration::from_secs(5) {
                return false;
            }
            std::hint::spin_loop();
        }
        true
    }

    /// Nested parallel work while the other threads spin, on pools of 2 to 4 threads, runs to
    /// the end with the right result (the spinners take part of it and never wait on
    /// themselves), and the spinners stop when the scope ends.
    #[test]
    fn spinning_scopes_finish_and_stop_spinning() {
        for threads in [2, 3, 4] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build();
            let pool = pool.expect("pool");
            for round in 0..50u64 {
                let (live, mut sum, mut started) = (Arc::default(), 0u64, true);
                pool.install(|| {
                    with_spinners(threads, &live, &|| true, &mut || {
                        // (On more threads a spinner not taken up in time is dropped.)
                        started = round > 0 || threads > 2 || starts(&live);
                        sum = (0..200u64)
                            .into_par_iter()
                            .map(|i| (0..i + round).into_par_iter().sum::<u64>())
                            .sum();
                    })
                });
                assert!(started, "{threads} threads: no spinner started");
                let want: u64 = (0..200u64).map(|i| (0..i + round).sum::<u64>()).sum();
                assert_eq!(sum, want, "{threads} threads, round {round}");
                assert!(stops(&live), "{threads} threads: spinners still running");
            }
        }
    }

    /// A panic in the scope reaches the caller, the spinners stop all the same, and the
    /// backend still runs work afterwards.
    #[test]
    fn a_panicking_scope_stops_its_spinners() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build();
        let pool = pool.expect("pool");
        let (live, mut started) = (Arc::default(), false);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.install(|| {
                with_spinners(2, &live, &|| true, &mut || {
                    started = starts(&live);
                    (0..64)
                        .into_par_iter()
                        .for_each(|i| assert!(i != 40, "task 40 fails"));
                })
            })
        }));
        assert!(
            caught.is_err() && started,
            "the panic, after a spinner started"
        );
        assert!(stops(&live));
        let backend = crate::backend::CpuBackend::new(3);
        let mut n = 0;
        crate::backend::Backend::scope(&backend, &mut || n = (0..100).into_par_iter().count());
        assert_eq!(n, 100);
    }

    /// Spinners stop as soon as spinning no longer pays (the cores are taken), while the
    /// scope still runs.
    #[test]
    fn spinners_give_way_when_the_cores_are_taken() {
        static PAYS: AtomicBool = AtomicBool::new(true);
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build();
        let pool = pool.expect("pool");
        let (live, mut started, mut stopped) = (Arc::default(), false, false);
        pool.install(|| {
            with_spinners(2, &live, &|| PAYS.load(Ordering::Relaxed), &mut || {
                started = starts(&live);
                PAYS.store(false, Ordering::Relaxed);
                stopped = stops(&live);
            })
        });
        assert!(started && stopped, "started {started}, stopped {stopped}");
    }
}
