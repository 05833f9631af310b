//! The Node index at fleet scale (a measurement, printed; not a test): the heap
//! the inventory of N synthetic Nodes holds (6 vendors, `kaccel generate-fleet`),
//! and what one Node's change costs while a re-plan holds the index's snapshot,
//! as it does for the whole reconcile (a cordon kaccel writes comes back on the
//! watch while it runs): heap allocated by the change and its time.
//!
//!   cargo bench --bench inventory [-- N]      # default 5000

use std::hint::black_box;
use std::time::Instant;

use kaccel::inventory::index::NodeIndex;
use kaccel::inventory::synthetic::generate_fleet;

#[path = "support/counting_alloc.rs"]
mod counting_alloc;

#[global_allocator]
static ALLOCATOR: counting_alloc::Counting = counting_alloc::Counting;

fn mib(bytes: isize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn main() {
    let nodes: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(5_000);
    let fleet = generate_fleet(nodes, 42);

    let before = counting_alloc::live_bytes();
    let mut index = NodeIndex::default();
    for node in &fleet {
        index.upsert(node);
    }
    let held_by_index = counting_alloc::live_bytes() - before;
    println!(
        "inventory of {nodes} Nodes: {:.1} MiB of heap ({} bytes per Node)",
        mib(held_by_index),
        held_by_index / nodes as isize
    );

    // One Node relabelled (as GPU feature discovery does after a card swap), then
    // back, each while a re-plan holds the snapshot.
    let original = fleet[nodes / 2].clone();
    let mut relabelled = original.clone();
    relabelled
        .metadata
        .labels
        .get_or_insert_default()
        .insert("kaccel.io/bench".into(), "changed".into());
    let rounds = 200;
    let mut copied = 0isize;
    let started = Instant::now();
    for round in 0..rounds {
        let held = index.snapshot();
        let live = counting_alloc::live_bytes();
        let changed = index.upsert(if round % 2 == 0 {
            &relabelled
        } else {
            &original
        });
        assert!(changed, "every round is a change");
        copied += counting_alloc::live_bytes() - live;
        black_box(held.nodes.len());
        // The re-plan ends: its copy goes.
        drop(held);
    }
    let per_change = started.elapsed() / rounds;
    println!(
        "one Node changed while a re-plan holds the snapshot: {:.3} ms, {:.2} MiB of heap allocated while both are held (mean of {rounds})",
        per_change.as_secs_f64() * 1000.0,
        mib(copied / rounds as isize)
    );
}
