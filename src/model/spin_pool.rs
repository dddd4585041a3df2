//! A fork-join for the many small parallel loops of a decode step, run by threads that spin between them.
//!
//! A SmolLM2 decode step splits about a hundred products and thirty attention passes across threads, each a
//! short piece of work. Through rayon each split is a job pushed onto a deque, stolen, run and signalled back
//! through a latch, in one piece per thread: the thread that finished first then waits for the other's whole
//! half. Here the calling thread publishes a stage (a closure over item ranges, and the item count) in one
//! shared slot; the helpers, already spinning (see `generate::with_spinning_pool`), claim ranges with one
//! compare-and-swap each, ranges that shrink as the stage drains (OpenMP's guided schedule), and the caller
//! claims too, so a stage finishes even if no helper shows up. Threads then spend more of a step in the kernels
//! and less waiting at the end of a split or spinning.
//!
//! A [`SpinPool`] is installed on the thread that owns it for the length of a forward pass
//! ([`SpinPool::installed`]); [`for_each_range`] and [`items_mut`] use it from that thread and fall back to the
//! current rayon pool anywhere else.

use std::cell::{Cell, UnsafeCell};
use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The shared slot through which one thread hands stages to the helpers spinning beside it.
pub struct SpinPool {
    /// `2 · stage number + 1` while a stage is open for helpers, `2 · stage number` once it is closed.
    state: AtomicUsize,
    /// The first item of the open stage not yet claimed.
    next: AtomicUsize,
    /// The owner and its helpers: a claim takes 1 / (2 · threads) of what is left.
    threads: usize,
    /// Helpers that may be reading [`SpinPool::task`]; the owner rewrites it only when none are.
    active: AtomicUsize,
    /// A range panicked (on a helper or the owner); the owner panics once the stage has ended.
    panicked: AtomicBool,
    /// The open stage's closure and item count. Written by the owner only while no helper is active and no
    /// stage is open; read by helpers only while they are counted in `active` and the stage is open.
    task: UnsafeCell<Task>,
}

#[derive(Clone, Copy)]
struct Task {
    /// Points to a closure on the owner's stack, alive until the stage closes and `active` is zero; the
    /// `'static` is a lie that [`SpinPool::run`] keeps true by waiting for both.
    f: *const (dyn Fn(Range<usize>) + Sync + 'static),
    n: usize,
}

// SAFETY: `task` is written only by the owning thread while no helper can read it (no stage open, `active`
// zero) and read by helpers only in the window the protocol in `run`/`help` describes; everything else is
// atomics.
unsafe impl Sync for SpinPool {}

thread_local! {
    /// The pool installed on this thread, and whether a stage of it is running here (a nested split then runs
    /// on this thread alone, since the slot is taken).
    static INSTALLED: Cell<(*const SpinPool, bool)> = const { Cell::new((std::ptr::null(), false)) };
}

fn no_task(_: Range<usize>) {}

impl SpinPool {
    /// A pool of the calling thread and `helpers` others.
    pub fn new(helpers: usize) -> Self {
        Self {
            state: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
            threads: helpers + 1,
            active: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            task: UnsafeCell::new(Task {
                f: &no_task as &(dyn Fn(Range<usize>) + Sync),
                n: 0,
            }),
        }
    }

    /// Runs `f` with this pool installed on the current thread: the splits `f` makes through
    /// [`for_each_range`] and [`items_mut`] go through the pool. Helpers must call [`SpinPool::help`] meanwhile,
    /// or the caller does all the work itself.
    pub fn installed<R>(&self, f: impl FnOnce() -> R) -> R {
        struct Restore((*const SpinPool, bool));
        impl Drop for Restore {
            fn drop(&mut self) {
                INSTALLED.with(|c| c.set(self.0));
            }
        }
        let _restore = Restore(INSTALLED.with(|c| c.replace((self as *const SpinPool, false))));
        f()
    }

    /// Runs `f` over ranges that together cover `0..n` exactly once, across the owner and whichever helpers
    /// join, returning when all have run.
    fn run(&self, n: usize, f: &(dyn Fn(Range<usize>) + Sync)) {
        // SAFETY: only the lifetime is erased; `f` outlives the stage, since this function returns only after
        // the stage is closed and no helper is active, the two conditions under which helpers read `task`.
        let f: *const (dyn Fn(Range<usize>) + Sync + 'static) = unsafe { std::mem::transmute(f) };
        // SAFETY: no stage is open and `active` is zero (both hold between calls of `run`), so no helper reads
        // `task` now.
        unsafe { *self.task.get() = Task { f, n } };
        self.next.store(0, Ordering::Relaxed);
        let open = (self.state.load(Ordering::Relaxed) | 1) + 2;
        // Release: a helper that sees the stage open also sees `task` and `next` as written above.
        self.state.store(open, Ordering::Release);
        self.claim(Task { f, n });
        // Every item is claimed now, by this thread (and run) or by a helper counted in `active` until it has
        // run its ranges. SeqCst on both sides (here: close, then read `active`; in `help`: count in, then read
        // `state`): either this thread sees the helper counted and waits for it, or the helper sees the stage
        // closed and leaves without reading `task`. The helper's Release decrement makes its writes visible.
        self.state.store(open - 1, Ordering::SeqCst);
        while self.active.load(Ordering::SeqCst) != 0 {
            std::hint::spin_loop();
        }
        if self.panicked.swap(false, Ordering::Relaxed) {
            panic!("a decode thread panicked in a parallel stage");
        }
    }

    /// Claims and runs ranges of `task` until none are left; returns how many items this call ran. Claims
    /// shrink as the stage drains (a share of what is left, as OpenMP's guided schedule deals): few claims
    /// while much is left and single items at the end, so that no thread waits long for another's last range.
    fn claim(&self, task: Task) -> usize {
        let mut ran = 0;
        let mut start = self.next.load(Ordering::Relaxed);
        while start < task.n {
            let take = ((task.n - start) / (2 * self.threads)).max(1);
            if let Err(now) = self.next.compare_exchange_weak(
                start,
                start + take,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                start = now;
                continue;
            }
            // SAFETY: `task.f` is alive while the stage is open or this thread is counted in `active` (see
            // `Task::f`), and the caller holds one of the two.
            let f = unsafe { &*task.f };
            if catch_unwind(AssertUnwindSafe(|| f(start..start + take))).is_err() {
                self.panicked.store(true, Ordering::Relaxed);
            }
            ran += take;
            start = self.next.load(Ordering::Relaxed);
        }
        ran
    }

    /// Called in a helper's spin loop: joins the open stage, if one is open that this helper has not joined
    /// yet (`seen` remembers the last), and runs ranges until none are left. Returns whether it ran any.
    pub fn help(&self, seen: &mut usize) -> bool {
        let state = self.state.load(Ordering::Acquire);
        if state & 1 == 0 || state == *seen {
            return false;
        }
        self.active.fetch_add(1, Ordering::SeqCst);
        if self.state.load(Ordering::SeqCst) != state {
            self.active.fetch_sub(1, Ordering::Release);
            return false;
        }
        *seen = state;
        // SAFETY: the stage is open and this thread is counted in `active`, so the owner neither rewrites
        // `task` nor lets its closure go until this thread leaves.
        let task = unsafe { *self.task.get() };
        let ran = self.claim(task);
        self.active.fetch_sub(1, Ordering::Release);
        ran > 0
    }
}

/// Runs `f` in parallel over ranges that together cover `0..n` once each: through the pool installed on this
/// thread if there is one (and no stage of it is already running here), otherwise on the current rayon pool (a
/// range per thread).
pub fn for_each_range(n: usize, f: impl Fn(Range<usize>) + Sync) {
    let (pool, busy) = INSTALLED.with(|c| c.get());
    if pool.is_null() || busy {
        use rayon::prelude::*;
        let per = n.div_ceil(rayon::current_num_threads()).max(1);
        (0..n.div_ceil(per))
            .into_par_iter()
            .for_each(|i| f(i * per..((i + 1) * per).min(n)));
        return;
    }
    // SAFETY: `installed` keeps the pool alive, and installed on this thread, while its closure runs, and this
    // call happens inside that closure (it is this thread's installed pool).
    let pool = unsafe { &*pool };
    INSTALLED.with(|c| c.set((pool, true)));
    struct Idle(*const SpinPool);
    impl Drop for Idle {
        fn drop(&mut self) {
            INSTALLED.with(|c| c.set((self.0, false)));
        }
    }
    let _idle = Idle(pool);
    pool.run(n, &f);
}

/// Runs `f(first, part)` in parallel over parts of `out` that together cover it once, each a whole number of
/// `item_len` items (the last item may be shorter), `first` being the index of the part's first item; split as
/// [`for_each_range`] splits.
pub fn items_mut<T: Send>(out: &mut [T], item_len: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let item_len = item_len.max(1);
    let len = out.len();
    let shared = SharedSlice::new(out);
    for_each_range(len.div_ceil(item_len), |items| {
        let values = items.start * item_len..(items.end * item_len).min(len);
        // SAFETY: `out` is borrowed mutably for this whole call, and the item ranges handed out are disjoint,
        // so the parts are too.
        f(items.start, unsafe { shared.part(values) })
    });
}

/// A slice's base pointer, shared with the threads that write disjoint parts of it.
pub(crate) struct SharedSlice<T>(*mut T, usize);

impl<T> SharedSlice<T> {
    pub(crate) fn new(out: &mut [T]) -> Self {
        Self(out.as_mut_ptr(), out.len())
    }

    /// The slice's base pointer, for threads that write disjoint strided parts (columns of a matrix); what
    /// `part` checks is then the caller's to keep.
    pub(crate) fn as_ptr(&self) -> *mut T {
        self.0
    }

    /// The values `range` of the slice.
    ///
    /// # Safety
    /// The slice outlives the returned part, and no other live reference overlaps `range` (threads take
    /// disjoint ranges).
    // Handing out `&mut` parts from a shared handle is the point: threads hold it together and take disjoint
    // parts, which the caller promises.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn part(&self, range: Range<usize>) -> &mut [T] {
        assert!(
            range.start <= range.end && range.end <= self.1,
            "part {range:?} of {}",
            self.1
        );
        // SAFETY: inside the slice (checked above), alive and unaliased (the caller's promise).
        unsafe { std::slice::from_raw_parts_mut(self.0.add(range.start), range.len()) }
    }
}

// SAFETY: the pointer only hands out disjoint parts of a slice of `Send` values (see `part`).
unsafe impl<T: Send> Sync for SharedSlice<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    /// The owner and a helper run every item exactly once, stage after stage, and the owner returns only when
    /// all are done (items sleep, so the helper joins most stages and finishes some items after the owner ran
    /// out of claims); without an installed pool the split falls back to rayon.
    #[test]
    fn every_item_runs_once() {
        let pool = SpinPool::new(1);
        let stop = AtomicBool::new(false);
        let helped = AtomicUsize::new(0);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut seen = 0;
                while !stop.load(Ordering::Acquire) {
                    if pool.help(&mut seen) {
                        helped.fetch_add(1, Ordering::Relaxed);
                    } else {
                        std::hint::spin_loop();
                    }
                }
            });
            // Stops the helper however this thread leaves the scope, so that a failed check fails, not hangs.
            struct Stop<'a>(&'a AtomicBool);
            impl Drop for Stop<'_> {
                fn drop(&mut self) {
                    self.0.store(true, Ordering::Release);
                }
            }
            let _stop = Stop(&stop);
            pool.installed(|| {
                for stage in 0..300 {
                    let n = 1 + stage % 37;
                    let mut out = vec![0usize; n * 5 - stage % 5];
                    items_mut(&mut out, 5, |first, part| {
                        std::thread::sleep(std::time::Duration::from_micros(20));
                        for (j, v) in part.iter_mut().enumerate() {
                            *v += first + j / 5 + 1;
                        }
                    });
                    for (j, v) in out.iter().enumerate() {
                        assert_eq!(*v, j / 5 + 1, "stage {stage}, value {j}");
                    }
                }
            });
        });
        assert!(
            helped.into_inner() > 30,
            "the helper joined too few stages to test anything"
        );
        let mut out = vec![0usize; 100];
        items_mut(&mut out, 7, |first, part| {
            for (j, v) in part.iter_mut().enumerate() {
                *v += first * 7 + j;
            }
        });
        assert!(out.iter().enumerate().all(|(j, v)| *v == j));
    }

    /// A nested split inside a stage runs on rayon instead of overwriting the open stage; a stage whose range
    /// panics on the owner panics once the stage is over, leaving the pool usable.
    #[test]
    fn nested_splits_and_panics() {
        let pool = SpinPool::new(0);
        let total = AtomicUsize::new(0);
        pool.installed(|| {
            for_each_range(4, |outer| {
                for _ in outer {
                    for_each_range(3, |inner| {
                        total.fetch_add(inner.map(|j| j + 1).sum(), Ordering::Relaxed);
                    })
                }
            })
        });
        assert_eq!(total.into_inner(), 24);
        let panicked = std::panic::catch_unwind(AssertUnwindSafe(|| {
            pool.installed(|| for_each_range(2, |_| panic!("range")))
        }));
        assert!(panicked.is_err());
        let ran = AtomicUsize::new(0);
        pool.installed(|| {
            for_each_range(5, |r| {
                ran.fetch_add(r.len(), Ordering::Relaxed);
            })
        });
        assert_eq!(ran.into_inner(), 5);
    }
}
