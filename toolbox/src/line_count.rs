//! The background line counter: after a view that left a file's total line
//! count unknown, one thread reads on from the index's frontier to the end
//! of the file, so that a later view's header can state the total.
//!
//! Bounded: one thread for the whole toolbox, counting one file at a time
//! (the most recently viewed: a new count replaces the one under way, whose
//! progress stays in the index), at a lower CPU priority than commands, in
//! steps of [`STEP_BYTES`] whose progress is published as it goes. A
//! request that reads the same file stops the count (it reads the file
//! itself, and restarts the count after its page); so do a changed file (its
//! index entry no longer matches) and the end of the toolbox.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;

/// Bytes counted between two publications of progress (and checks that the
/// count is still wanted, besides the one between reads).
pub const STEP_BYTES: u64 = 16 * 1024 * 1024;
/// The counter's `nice` value: commands the model runs come first.
const NICENESS: i32 = 10;
/// The counting thread's name, as `/proc/<pid>/task/<tid>/comm` shows it.
pub const THREAD_NAME: &str = "kiln-linecount";

/// Shared by the request threads (through the index) and the counting thread.
#[derive(Debug, Default)]
pub struct Counter {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    state: Mutex<State>,
    wake: Condvar,
    /// Bumped to stop the count under way: it runs while this is unchanged.
    generation: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    /// The next file to count.
    pending: Option<Job>,
    /// The file being counted, with its generation.
    running: Option<(PathBuf, u64)>,
    started: bool,
    stopped: bool,
}

/// One step of a count: counts on from where the index stands (at most
/// [`STEP_BYTES`]), publishes what it learned, and says whether the count
/// is over (the end reached, the file changed or the index gone). Given by
/// the index (`line_index`), which this module knows nothing of.
pub type Step = Box<dyn FnMut(&dyn Fn() -> bool) -> Done + Send>;

/// Whether a count is over after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Done {
    Yes,
    No,
}

struct Job {
    path: PathBuf,
    step: Step,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job").field("path", &self.path).finish_non_exhaustive()
    }
}

impl Counter {
    /// Counts `path` next, a `step` at a time, in place of anything under
    /// way.
    pub(crate) fn start(&self, path: PathBuf, step: Step) {
        let mut state = self.inner.lock();
        if state.stopped {
            return;
        }
        self.inner.generation.fetch_add(1, Ordering::SeqCst);
        state.pending = Some(Job { path, step });
        if !state.started {
            let inner = self.inner.clone();
            let spawned = thread::Builder::new().name(THREAD_NAME.into()).spawn(move || run(&inner));
            // Without a thread (at the pids limit) totals are found by later pages.
            state.started = spawned.is_ok();
        }
        self.inner.wake.notify_all();
    }

    /// Stops counting `path`, if it is being counted or is next.
    pub(crate) fn cancel(&self, path: &Path) {
        let mut state = self.inner.lock();
        if state.pending.as_ref().is_some_and(|j| j.path == path) {
            state.pending = None;
        }
        if let Some((p, generation)) = &state.running
            && p == path
        {
            // Only that count's generation: a newer job is not touched.
            let _ =
                self.inner.generation.compare_exchange(*generation, generation + 1, Ordering::SeqCst, Ordering::SeqCst);
        }
    }

    /// Ends the counting thread (the toolbox is shutting down).
    pub(crate) fn stop(&self) {
        let mut state = self.inner.lock();
        state.stopped = true;
        state.pending = None;
        self.inner.generation.fetch_add(1, Ordering::SeqCst);
        self.inner.wake.notify_all();
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for the next file to count; `None` once stopped.
    fn next_job(&self) -> Option<(Job, u64)> {
        let mut state = self.lock();
        state.running = None;
        loop {
            if state.stopped {
                return None;
            }
            if let Some(job) = state.pending.take() {
                let generation = self.generation.load(Ordering::SeqCst);
                state.running = Some((job.path.clone(), generation));
                return Some((job, generation));
            }
            state = self.wake.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// The counting thread: takes a job, counts it step by step, repeats; ends
/// when the counter is stopped (the index stops it when it is dropped).
fn run(inner: &Inner) {
    lower_priority();
    while let Some((mut job, generation)) = inner.next_job() {
        let stop = || inner.generation.load(Ordering::SeqCst) != generation;
        while !stop() && (job.step)(&stop) == Done::No {}
    }
}

fn lower_priority() {
    let tid = rustix::thread::gettid();
    let _ = rustix::process::setpriority_process(Some(tid), NICENESS);
}
