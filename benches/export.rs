//! The export writers' work per row (criterion): 10,000 entries of the ledger
//! bench's synthetic cluster (`kaccel ledger bench`: Reserves, hourly Posts and
//! Voids of hundreds of workloads) written as plain CSV and as FOCUS 1.2 into a
//! sink, no store involved: what the exporting task spends per row while the
//! store's reader fetches the next page. Only public calls: builds of older
//! commits run it unchanged, for a same-machine comparison.
//!
//!   cargo bench --bench export

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kaccel::cli::ledger::synthetic_entries;
use kaccel::ledger::export::{Exporter, Format, Parties, Pricing};
use kaccel::ledger::store::StoredEntry;

const ROWS: usize = 10_000;

fn export(c: &mut Criterion) {
    let entries: Vec<StoredEntry> = synthetic_entries("bench-export", ROWS)
        .enumerate()
        .map(|(i, entry)| StoredEntry {
            id: i as i64 + 1,
            entry,
        })
        .collect();
    let mut group = c.benchmark_group("export");
    group.throughput(Throughput::Elements(ROWS as u64));
    for (name, format) in [("csv", Format::Csv), ("focus", Format::Focus)] {
        group.bench_function(format!("{name} 10000 entries"), |b| {
            b.iter(|| {
                let pricing = Pricing::new("EUR", "0.5").expect("a valid price");
                let sink = std::io::BufWriter::new(std::io::sink());
                let mut ex =
                    Exporter::new(sink, format, pricing, Parties::default()).expect("a header");
                for e in &entries {
                    ex.write(e).expect("a row");
                }
                ex.rows()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, export);
criterion_main!(benches);
