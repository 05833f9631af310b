//! `kaccel ledger export|verify` (and the hidden `bench`).

use std::io::Write;
use std::time::Instant;

use clap::{Subcommand, ValueEnum};

use crate::ledger::Rate;
use crate::ledger::conformance::{admission, grant_like};
use crate::ledger::entry::{Entry, EntryKind};
use crate::ledger::export::{DEFAULT_PROVIDER, Format, Parties, Pricing, export_entries};
use crate::ledger::store::{EntryFilter, LedgerStore, Store, verify};

#[derive(clap::Args, Debug)]
pub struct LedgerArgs {
    #[command(subcommand)]
    pub command: LedgerCommand,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum ExportFormat {
    /// One row per ledger entry.
    Csv,
    /// FOCUS 1.2 cost and usage CSV (charges only: posts and corrections).
    Focus,
    /// One JSON object per entry per line.
    Json,
}

#[derive(Subcommand, Debug)]
pub enum LedgerCommand {
    /// Stream ledger entries whose interval starts in [--from, --to) to stdout.
    Export {
        /// sqlite:PATH or postgres://USER@HOST:PORT/DB
        #[arg(long, env = "KACCEL_LEDGER_STORE")]
        store: String,
        /// Inclusive start, RFC 3339 (2026-01-01T00:00:00Z).
        #[arg(long)]
        from: jiff::Timestamp,
        /// Exclusive end, RFC 3339.
        #[arg(long)]
        to: jiff::Timestamp,
        /// Only this team.
        #[arg(long)]
        team: Option<String>,
        /// Only entries of admissions that held this device (its UUID): which jobs
        /// ran on a card.
        #[arg(long)]
        device: Option<String>,
        #[arg(long, value_enum, default_value_t = ExportFormat::Csv)]
        format: ExportFormat,
        /// Billing currency of FOCUS exports (ISO 4217).
        #[arg(long, default_value = "EUR")]
        currency: String,
        /// Price of one credit in the billing currency.
        #[arg(long, default_value = "1")]
        credit_price: String,
        /// FOCUS ProviderName: who makes the devices available (the platform).
        #[arg(long, env = "KACCEL_FOCUS_PROVIDER", default_value = DEFAULT_PROVIDER)]
        provider: String,
        /// FOCUS PublisherName (default: the provider).
        #[arg(long, env = "KACCEL_FOCUS_PUBLISHER")]
        publisher: Option<String>,
        /// FOCUS InvoiceIssuerName: who issues the chargeback (default: the provider).
        #[arg(long, env = "KACCEL_FOCUS_INVOICE_ISSUER")]
        invoice_issuer: Option<String>,
    },
    /// Recompute every balance from the entries and check every reservation; exits
    /// non-zero on any mismatch (the report goes to stderr).
    Verify {
        #[arg(long, env = "KACCEL_LEDGER_STORE")]
        store: String,
        /// Also reconcile with the cluster (KUBECONFIG, or the in-cluster
        /// service account): open reservations against the Workloads holding
        /// quota, and charged devices against Kueue's ClusterQueue usage.
        #[arg(long)]
        cluster: bool,
        /// The credit AdmissionCheck's name (ledger.admissionCheckName).
        #[arg(long, default_value = "kaccel-credits")]
        admission_check: String,
    },
    /// Measure append throughput and a full FOCUS export of the store.
    #[command(hide = true)]
    Bench {
        #[arg(long, env = "KACCEL_LEDGER_STORE")]
        store: String,
        #[arg(long, default_value_t = 100_000)]
        entries: usize,
        #[arg(long, default_value_t = 1000)]
        batch: usize,
    },
}

pub fn run(args: &LedgerArgs) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(run_async(args))
}

async fn run_async(args: &LedgerArgs) -> Result<(), String> {
    match &args.command {
        LedgerCommand::Export {
            store,
            from,
            to,
            team,
            device,
            format,
            currency,
            credit_price,
            provider,
            publisher,
            invoice_issuer,
        } => {
            let pricing = Pricing::new(currency, credit_price).map_err(|e| e.to_string())?;
            let parties = Parties::new(provider, publisher.as_deref(), invoice_issuer.as_deref())
                .map_err(|e| e.to_string())?;
            if from >= to {
                return Err(format!("--from {from} must be before --to {to}"));
            }
            let store = Store::open(store).await.map_err(|e| e.to_string())?;
            let filter = EntryFilter {
                from: Some(from.as_second()),
                to: Some(to.as_second()),
                team: team.clone(),
                device: device.clone(),
            };
            let stdout = std::io::stdout().lock();
            export(
                &store,
                &filter,
                *format,
                pricing,
                parties,
                std::io::BufWriter::new(stdout),
            )
            .await
            .map(|_| ())
        }
        LedgerCommand::Verify {
            store,
            cluster,
            admission_check,
        } => {
            let store = Store::open(store).await.map_err(|e| e.to_string())?;
            let mut report = verify(&store).await.map_err(|e| e.to_string())?;
            if *cluster {
                let findings = reconcile_with_cluster(&store, admission_check).await?;
                report.problems.extend(
                    findings
                        .into_iter()
                        .map(|f| format!("budget {}: {}", f.budget, f.message)),
                );
            }
            let mut err = std::io::stderr().lock();
            let _ = writeln!(
                err,
                "ledger verify: {} entries, {} reservations ({} open), {} budgets",
                report.entries,
                report.reservations,
                report.open_reservations,
                report.budgets.len()
            );
            for (name, b) in &report.budgets {
                let _ = writeln!(
                    err,
                    "  budget {name}: granted {} reserved {} spent {} remaining {}",
                    crate::ledger::entry::format_micros(b.granted),
                    crate::ledger::entry::format_micros(b.reserved),
                    crate::ledger::entry::format_micros(b.spent),
                    crate::ledger::entry::format_micros(b.remaining())
                );
            }
            for p in &report.problems {
                let _ = writeln!(err, "  MISMATCH: {p}");
            }
            if report.ok() {
                let _ = writeln!(err, "ledger verify: OK");
                Ok(())
            } else {
                Err(format!(
                    "ledger verify found {} problem(s)",
                    report.problems.len()
                ))
            }
        }
        LedgerCommand::Bench {
            store,
            entries,
            batch,
        } => bench(store, *entries, (*batch).max(1)).await,
    }
}

/// The ledger's open reservations against the cluster's Workloads and kaccel's
/// ClusterQueues ([`crate::ledger::drift::compare`]).
async fn reconcile_with_cluster<S: LedgerStore>(
    store: &S,
    check: &str,
) -> Result<Vec<crate::ledger::drift::Finding>, String> {
    use kube::api::{Api, DynamicObject, ListParams};
    let client = kube::Client::try_default()
        .await
        .map_err(|e| format!("cannot reach the cluster (KUBECONFIG): {e}"))?;
    let list = |kind: &'static str, params: ListParams| {
        let api: Api<DynamicObject> =
            Api::all_with(client.clone(), &crate::k8s::resources::kueue(kind));
        async move {
            api.list(&params)
                .await
                .map_err(|e| format!("listing {kind}s: {e}"))
                .map(|l| {
                    l.items
                        .into_iter()
                        .map(|o| serde_json::to_value(o).expect("objects serialise"))
                        .collect::<Vec<_>>()
                })
        }
    };
    let managed = ListParams::default().labels(&format!(
        "{}={}",
        crate::k8s::labels::MANAGED_BY_LABEL,
        crate::k8s::labels::MANAGED_BY
    ));
    let queues = list("ClusterQueue", managed).await?;
    // Typed: only the fields the comparison reads are kept of each Workload.
    let workloads = Api::<crate::kueue::workload::Workload>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("listing Workloads: {e}"))?
        .items;
    let open = store.open_reservations().await.map_err(|e| e.to_string())?;
    Ok(crate::ledger::drift::compare(
        &open,
        &workloads,
        &queues,
        &crate::ledger::drift::queue_budgets(&queues),
        check,
    ))
}

/// Streams the matching entries into `out` in `format`; returns the rows written.
pub async fn export<S: LedgerStore, W: Write>(
    store: &S,
    filter: &EntryFilter,
    format: ExportFormat,
    pricing: Pricing,
    parties: Parties,
    out: W,
) -> Result<u64, String> {
    let format = match format {
        ExportFormat::Csv => Format::Csv,
        ExportFormat::Focus => Format::Focus,
        ExportFormat::Json => Format::Json,
    };
    export_entries(store, filter, format, pricing, parties, out).await
}

/// Peak resident memory of this process in KiB (`VmHWM`), if the kernel says.
pub fn peak_rss_kib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Synthetic two-phase entries: per workload one Reserve, 8 hourly Posts and a
/// Void; one Grant per budget. `run` keeps runs on one store apart.
pub fn synthetic_entries(run: &str, count: usize) -> impl Iterator<Item = Entry> {
    let t0: i64 = 1_767_225_600; // 2026-01-01T00:00:00Z
    let rate = Rate(4_000_000);
    let run = run.to_string();
    (0..)
        .flat_map(move |w: usize| {
            let budget = format!("team-{}", w % 10);
            let uid = format!("{run}-{w:08}");
            let start = t0 + (w as i64 % 720) * 3600;
            let units = 1 + (w as u64 % 8);
            let base = Entry {
                key: String::new(),
                kind: EntryKind::Reserve,
                budget: budget.clone(),
                team: format!("t{}", w % 10),
                namespace: format!("ns-{}", w % 10),
                workload: format!("job-{w}"),
                workload_uid: uid.clone(),
                admission: 1,
                class: "gpu-large".into(),
                flavor: "nvidia-h100-80gb".into(),
                resource: "nvidia.com/gpu".into(),
                device_units: units,
                start,
                end: start + 10 * 3600,
                credits: 0,
                rate_card: "rc-bench".into(),
                reason: String::new(),
                created_at: start,
                rate: rate.0,
                devices: vec![],
            };
            let mut out = Vec::with_capacity(11);
            if w < 10 {
                out.push(grant_like(
                    &Entry {
                        start: t0,
                        ..base.clone()
                    },
                    1_000_000_000_000,
                ));
            }
            out.extend(admission(&base, rate, 8));
            out
        })
        .take(count)
}

async fn bench(url: &str, entries: usize, batch: usize) -> Result<(), String> {
    let store = Store::open(url).await.map_err(|e| e.to_string())?;
    let run = format!("bench{}", jiff::Timestamp::now().as_millisecond());
    let mut it = synthetic_entries(&run, entries).peekable();
    let mut first_batch = Vec::new();
    let t = Instant::now();
    let mut n = 0usize;
    while it.peek().is_some() {
        let chunk: Vec<Entry> = it.by_ref().take(batch).collect();
        let out = store.append(&chunk).await.map_err(|e| e.to_string())?;
        n += out.inserted;
        if first_batch.is_empty() {
            first_batch = chunk;
        }
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "append: {n} entries in {secs:.2} s = {:.0} entries/s (batches of {batch}, one transaction each)",
        n as f64 / secs
    );
    let replay = store
        .append(&first_batch)
        .await
        .map_err(|e| e.to_string())?;
    println!(
        "replay of the first batch: inserted {}, duplicates {}",
        replay.inserted, replay.duplicates
    );
    let rss_before = peak_rss_kib().unwrap_or(0);
    let t = Instant::now();
    let rows = export(
        &store,
        &EntryFilter::default(),
        ExportFormat::Focus,
        Pricing::new("EUR", "0.5").map_err(|e| e.to_string())?,
        Parties::default(),
        std::io::BufWriter::new(std::io::sink()),
    )
    .await?;
    let secs = t.elapsed().as_secs_f64();
    println!(
        "export focus: {rows} rows from the whole store in {secs:.2} s = {:.0} rows/s; peak RSS (VmHWM) {} KiB before export, {} KiB after",
        rows as f64 / secs,
        rss_before,
        peak_rss_kib().unwrap_or(0)
    );
    let t = Instant::now();
    let report = verify(&store).await.map_err(|e| e.to_string())?;
    println!(
        "verify: {} entries, {} problems, in {:.2} s",
        report.entries,
        report.problems.len(),
        t.elapsed().as_secs_f64()
    );
    Ok(())
}
