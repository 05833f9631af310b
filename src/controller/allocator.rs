//! Giving freed heap back to the system.
//!
//! glibc's allocator keeps memory that was freed inside its arenas (one per
//! thread that allocated, up to 8 per core): after a cluster's Workload history
//! is deleted, the caches shrink but RSS stays where the peak left it
//! (`e2e/bench-memory.sh`: 50 MiB after deleting 20,000 Workloads, from 28 MiB
//! before them). `malloc_trim` returns every free page of every arena; it costs
//! a walk over the free chunks, so kaccel calls it after each re-plan (which
//! frees the most at once) and on a slow tick, never after each free.

use std::time::Duration;

/// A memory figure of this process from `/proc/self/status` in KiB (`VmRSS`
/// now, `VmHWM` the peak), if the kernel says.
pub fn memory_kib(field: &str) -> Option<u64> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// How often freed memory is handed back when nothing asks sooner.
pub const TRIM_INTERVAL: Duration = Duration::from_secs(30);

/// The least time between two trims, however often they are asked for.
pub const TRIM_SPACING: Duration = Duration::from_secs(1);

/// Returns the allocator's free pages to the system; true when some were.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn release_free_memory() -> bool {
    // SAFETY: malloc_trim only walks the allocator's own free lists; 0 keeps
    // no extra padding at the top of the main heap.
    unsafe { libc::malloc_trim(0) == 1 }
}

/// Other allocators return memory on their own (musl's frees pages eagerly).
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn release_free_memory() -> bool {
    false
}

/// Asks the trim task for a trim soon, as a re-plan ends: one allocates and
/// frees tens of MiB (the plan, the JSON of the objects it compares; every
/// desired object's JSON when this was measured), and between 30 s trims a
/// burst of Node or health changes held them resident
/// (`e2e/bench-controller.sh scale`: 90.9 MiB settled, 181.3 MiB after 20
/// changes in a row).
#[derive(Clone, Default)]
pub struct TrimRequests(std::sync::Arc<tokio::sync::Notify>);

impl TrimRequests {
    pub fn request(&self) {
        // A request while a trim runs or the task waits out the spacing is
        // kept (one permit) and served right after.
        self.0.notify_one();
    }
}

/// Trims when asked and on every [`TRIM_INTERVAL`] tick, at most once per
/// [`TRIM_SPACING`], until the process ends, timing each.
pub async fn trim_when_asked(requests: TrimRequests, metrics: super::metrics::Metrics) {
    let mut tick = tokio::time::interval(TRIM_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = requests.0.notified() => {}
        }
        // Blocking: it walks the free chunks only, so it is short for a heap of
        // kaccel's size; `kaccel_allocator_trim_seconds` shows how short.
        let started = std::time::Instant::now();
        let released = release_free_memory();
        let took = started.elapsed();
        metrics.allocator_trim.observe(took.as_secs_f64());
        tracing::debug!(released, took = ?took, "returned free heap to the system");
        tokio::time::sleep(TRIM_SPACING).await;
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    fn rss_kib() -> u64 {
        memory_kib("VmRSS").unwrap()
    }

    /// Many small blocks freed out of order from another thread's arena stay
    /// resident until trimmed; the trim gives most of them back.
    #[test]
    fn a_trim_returns_freed_small_blocks() {
        let before_alloc = rss_kib();
        let blocks = std::thread::spawn(|| {
            let mut blocks: Vec<Vec<u8>> = (0..200_000).map(|i| vec![i as u8; 700]).collect();
            // Keep every 64th block: freed chunks between them cannot be given
            // back by the free that made them, only by a trim.
            let kept: Vec<Vec<u8>> = blocks.iter().step_by(64).cloned().collect();
            blocks.clear();
            blocks.shrink_to_fit();
            kept
        })
        .join()
        .unwrap();
        let grown = rss_kib().saturating_sub(before_alloc);
        release_free_memory();
        let after_trim = rss_kib().saturating_sub(before_alloc);
        assert!(
            grown > 50_000,
            "the test should hold over 50 MiB of freed blocks first; grew {grown} KiB"
        );
        assert!(
            after_trim < grown / 2,
            "still {after_trim} KiB of {grown} KiB resident after the trim"
        );
        drop(blocks);
    }
}
