//! Giving freed heap back to the system.
//!
//! glibc's allocator keeps memory that was freed inside its arenas (one per
//! thread that allocated, up to 8 per core): after a cluster's Workload history
//! is deleted, the caches shrink but RSS stays where the peak left it
//! (`e2e/bench-memory.sh`: 50 MiB after deleting 20,000 Workloads, from 28 MiB
//! before them). `malloc_trim` returns every free page of every arena; it costs
//! a walk over the free chunks, so kaccel calls it after a re-plan (which frees
//! the most at once) and on a slow tick, never after each free.
//!
//! Not after every re-plan: the next one faults the pages it needs in again
//! (`cargo bench --bench plan -- "nodes 5000"`: 17.1 ms warm against 25.6 ms
//! right after a trim, for 8 MiB of transient heap). So the heap a re-plan
//! leaves free is kept for the next while the process stays within
//! [`WARM_RESERVE_KIB`] of the size the last trim left it, and given back once
//! re-plans pause for a tick's length.

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

/// How much a re-plan may leave the process above its size after the last trim
/// before a trim follows it: a re-plan of 5,000 Nodes holds about 8 MiB while it
/// runs (the plan alone; `VmRSS` around one in `cargo bench --bench plan`), and
/// the controller's tokio threads each allocate from their own arena.
pub const WARM_RESERVE_KIB: u64 = 16 * 1024;

/// Whether to trim now. `asked` when a re-plan just ended: only if the process
/// grew more than [`WARM_RESERVE_KIB`] since the last trim left it at
/// `after_last_trim_kib`. On the tick: only once re-plans have paused for
/// [`TRIM_INTERVAL`] (a cache that shrank, as a deleted Workload history, frees
/// heap no re-plan asks to trim). Unknown sizes trim, as before.
pub fn should_trim(
    asked: bool,
    rss_kib: Option<u64>,
    after_last_trim_kib: Option<u64>,
    since_last_replan: Duration,
) -> bool {
    if !asked {
        return since_last_replan >= TRIM_INTERVAL;
    }
    match (rss_kib, after_last_trim_kib) {
        (Some(rss), Some(after_trim)) => rss > after_trim + WARM_RESERVE_KIB,
        _ => true,
    }
}

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

/// When the trim task next looks on its own: an interval after the later of the
/// last re-plan and its last look. A fixed tick looked up to two intervals after
/// a burst of re-plans ended (the first tick after it came too soon, the pause
/// being shorter than an interval), and the fleet bench's settled reading, 45 s
/// after its last write, caught the start-up's free heap still resident (123.0
/// MiB, 97.7 MiB once trimmed; `e2e/bench-controller.sh scale 5000 20000`).
pub fn next_look(
    last_replan: std::time::Instant,
    last_look: std::time::Instant,
) -> std::time::Instant {
    last_replan.max(last_look) + TRIM_INTERVAL
}

/// Tells the trim task a re-plan ended, which may call for a trim
/// ([`should_trim`]): one allocates and frees tens of MiB (the plan, the JSON of
/// the objects it compares; every desired object's JSON when this was measured),
/// and between 30 s trims a burst of Node or health changes held them resident
/// (`e2e/bench-controller.sh scale`: 90.9 MiB settled, 181.3 MiB after 20 changes
/// in a row).
#[derive(Clone, Default)]
pub struct TrimRequests(std::sync::Arc<tokio::sync::Notify>);

impl TrimRequests {
    pub fn request(&self) {
        // A request while a trim runs or the task waits out the spacing is
        // kept (one permit) and served right after.
        self.0.notify_one();
    }
}

/// Trims when asked and on every [`TRIM_INTERVAL`] tick as [`should_trim`]
/// says, at most once per [`TRIM_SPACING`], until the process ends, timing each.
pub async fn trim_when_asked(requests: TrimRequests, metrics: super::metrics::Metrics) {
    let mut after_last_trim_kib = memory_kib("VmRSS");
    let mut last_replan = std::time::Instant::now();
    let mut last_look = last_replan;
    loop {
        let look_at = next_look(last_replan, last_look);
        let asked = tokio::select! {
            _ = tokio::time::sleep_until(look_at.into()) => {
                last_look = std::time::Instant::now();
                false
            }
            _ = requests.0.notified() => true,
        };
        if asked {
            last_replan = std::time::Instant::now();
        }
        let rss_kib = memory_kib("VmRSS");
        if !should_trim(asked, rss_kib, after_last_trim_kib, last_replan.elapsed()) {
            continue;
        }
        // Blocking: it walks the free chunks only, so it is short for a heap of
        // kaccel's size; `kaccel_allocator_trim_seconds` shows how short.
        let started = std::time::Instant::now();
        let released = release_free_memory();
        let took = started.elapsed();
        metrics.allocator_trim.observe(took.as_secs_f64());
        after_last_trim_kib = memory_kib("VmRSS");
        tracing::debug!(
            released,
            took = ?took,
            asked,
            rss_kib,
            after_kib = after_last_trim_kib,
            "returned free heap to the system"
        );
        tokio::time::sleep(TRIM_SPACING).await;
    }
}

#[cfg(test)]
mod policy_tests {
    use super::*;

    const MIB: u64 = 1024;

    #[test]
    fn a_replan_keeps_its_heap_warm_within_the_reserve_and_a_pause_gives_it_back() {
        let just_now = Duration::ZERO;
        let after_trim = Some(80 * MIB);
        // A re-plan that left the process within the reserve: kept warm.
        assert!(!should_trim(true, Some(80 * MIB), after_trim, just_now));
        assert!(!should_trim(true, Some(96 * MIB), after_trim, just_now));
        // Past it (a burst held more, a cache grew): trimmed.
        assert!(should_trim(true, Some(96 * MIB + 1), after_trim, just_now));
        // The tick trims once re-plans have paused for an interval, not during them.
        assert!(!should_trim(
            false,
            Some(200 * MIB),
            after_trim,
            TRIM_INTERVAL / 2
        ));
        assert!(should_trim(
            false,
            Some(80 * MIB),
            after_trim,
            TRIM_INTERVAL
        ));
        // Sizes unknown (no /proc): every re-plan trims, as before.
        assert!(should_trim(true, None, after_trim, just_now));
        assert!(should_trim(true, Some(80 * MIB), None, just_now));
    }

    /// The task looks an interval after a burst of re-plans ends, and then every
    /// interval while none comes: the look after the burst trims (re-plans
    /// paused for an interval), where a fixed tick could wait nearly two.
    #[test]
    fn the_look_after_a_burst_comes_one_interval_after_its_last_replan() {
        let start = std::time::Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        // Nothing re-planned since the last look: every interval.
        assert_eq!(next_look(start, at(30)), at(60));
        // A burst ended at 31 s, just after a look at 30 s: the next at 61 s, where
        // a tick fixed at 30 s steps found the pause too short at 60 s and came
        // back at 90 s.
        let look = next_look(at(31), at(30));
        assert_eq!(look, at(61));
        assert!(should_trim(
            false,
            Some(200 * MIB),
            Some(80 * MIB),
            look - at(31)
        ));
        assert!(!should_trim(
            false,
            Some(200 * MIB),
            Some(80 * MIB),
            at(60) - at(31)
        ));
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
