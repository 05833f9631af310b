//! `kaccel ledger export|verify` (and the hidden `bench`).

use std::io::Write;
use std::time::Instant;

use clap::{Subcommand, ValueEnum};

use crate::controller::allocator::memory_kib;
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
        /// The installation whose ledger this is (config `instance`): with
        /// --cluster, its ClusterQueues and check are compared.
        #[arg(long, default_value = crate::k8s::instance::DEFAULT_INSTANCE)]
        instance: String,
        /// The credit AdmissionCheck's name (ledger.admissionCheckName; default
        /// `<instance>-credits`).
        #[arg(long)]
        admission_check: Option<String>,
        /// With --cluster: Kueue's namespace, where each MultiKueue worker's
        /// kubeconfig Secret is (multiKueue.kueueNamespace). Every
        /// MultiKueueCluster the installation wrote is compared too: the
        /// Workloads charged as dispatched there against that worker's Kueue.
        #[arg(long, default_value = "kueue-system")]
        kueue_namespace: String,
    },
    /// Measure append throughput (the rate of each tenth of the run),
    /// single-entry append latency, CSV and FOCUS exports of the whole store
    /// and verify.
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
                kinds: None,
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
            instance,
            admission_check,
            kueue_namespace,
        } => {
            let store = Store::open(store).await.map_err(|e| e.to_string())?;
            let mut report = verify(&store).await.map_err(|e| e.to_string())?;
            if *cluster {
                let check = admission_check
                    .clone()
                    .unwrap_or_else(|| crate::k8s::instance::admission_check_name(instance));
                let findings =
                    reconcile_with_cluster(&store, instance, &check, kueue_namespace).await?;
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
    instance: &str,
    check: &str,
    kueue_namespace: &str,
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
    let managed = ListParams::default().labels(&crate::k8s::instance::managed_selector(instance));
    let queues: Vec<crate::kueue::ClusterQueueReservations> = list("ClusterQueue", managed.clone())
        .await?
        .into_iter()
        .map(serde_json::from_value)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("reading ClusterQueues: {e}"))?;
    let workers = list("MultiKueueCluster", managed).await?;
    // Typed: only the fields the comparison reads are kept of each Workload.
    let workloads = Api::<crate::kueue::workload::Workload>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("listing Workloads: {e}"))?
        .items;
    let open = store.open_reservations().await.map_err(|e| e.to_string())?;
    let mut findings = crate::ledger::drift::compare(
        &open,
        &workloads,
        &queues,
        &crate::ledger::drift::queue_budgets(&queues),
        check,
    );
    // Each MultiKueue worker's own Kueue: what it admits of the manager's work.
    for worker in &workers {
        let name = worker["metadata"]["name"].as_str().unwrap_or_default();
        let source = &worker["spec"]["clusterSource"]["kubeConfig"];
        let unreadable = |why: String| crate::ledger::drift::Finding {
            budget: String::new(),
            message: format!("worker {name}: cannot compare with its Kueue: {why}"),
            orphan: None,
        };
        if source["locationType"].as_str().unwrap_or("Secret") != "Secret" {
            findings.push(unreadable(
                "its kubeconfig is a file on Kueue's disk, not a Secret".into(),
            ));
            continue;
        }
        let secret = source["location"].as_str().unwrap_or_default();
        let remote =
            match crate::k8s::remote::client_from_secret(&client, kueue_namespace, secret).await {
                Ok(c) => c,
                Err(why) => {
                    findings.push(unreadable(why));
                    continue;
                }
            };
        match Api::<crate::kueue::workload::Workload>::all(remote)
            .list(&ListParams::default().labels(crate::ledger::drift::MULTIKUEUE_ORIGIN_LABEL))
            .await
        {
            Ok(copies) => findings.extend(crate::ledger::drift::compare_worker(
                name,
                &open,
                &workloads,
                &copies.items,
            )),
            Err(e) => findings.push(unreadable(format!("listing its Workloads: {e}"))),
        }
    }
    Ok(findings)
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
fn peak_rss_kib() -> Option<u64> {
    memory_kib("VmHWM")
}

/// Synthetic two-phase entries in the order a cluster writes them: one Grant
/// per budget, then per hour [`BENCH_ADMISSIONS_PER_HOUR`] admissions, each a
/// Reserve when it starts, a Post each hour after and the Void of the rest
/// after 8 hours, so a batch mixes entries of hundreds of workloads as the
/// credit check's appends do. Workload UIDs are random-looking UUIDs, as the
/// API server's are, so the indexes on the UID see a real cluster's random
/// inserts. `run` keeps runs on one store apart.
pub fn synthetic_entries(run: &str, count: usize) -> impl Iterator<Item = Entry> {
    const POSTED_HOURS: usize = 8;
    let t0: i64 = 1_767_225_600; // 2026-01-01T00:00:00Z
    let rate = Rate(4_000_000);
    let seed = run.bytes().fold(0x9e37_79b9_7f4a_7c15u64, |h, b| {
        splitmix64(h ^ u64::from(b))
    });
    let per_hour = BENCH_ADMISSIONS_PER_HOUR;
    let workload = move |w: usize| {
        let start = t0 + (w * 3600 / per_hour) as i64;
        Entry {
            key: String::new(),
            kind: EntryKind::Reserve,
            budget: format!("team-{}", w % 10),
            team: format!("t{}", w % 10),
            namespace: format!("ns-{}", w % 10),
            workload: format!("job-{w}"),
            workload_uid: uuid_like(seed, w as u64),
            admission: 1,
            class: "gpu-large".into(),
            flavor: "nvidia-h100-80gb".into(),
            resource: "nvidia.com/gpu".into(),
            device_units: 1 + (w as u64 % 8),
            start,
            end: start + 10 * 3600,
            credits: 0,
            rate_card: "rc-bench".into(),
            reason: String::new(),
            created_at: start,
            rate: rate.0,
            devices: vec![],
            cluster: String::new(),
        }
    };
    let grants: Vec<Entry> = (0..10)
        .map(|w| {
            grant_like(
                &Entry {
                    start: t0,
                    ..workload(w)
                },
                1_000_000_000_000,
            )
        })
        .collect();
    // The entries still to come of the last POSTED_HOURS + 1 hours' admissions,
    // oldest first; slot w writes entry j of admission w - j * per_hour.
    let mut recent: std::collections::VecDeque<std::vec::IntoIter<Entry>> =
        std::collections::VecDeque::new();
    let mut slot = 0usize;
    let mut due: Vec<Entry> = Vec::new();
    let slots = std::iter::from_fn(move || {
        if due.is_empty() {
            recent.push_back(admission(&workload(slot), rate, POSTED_HOURS as i64).into_iter());
            if recent.len() > (POSTED_HOURS + 2) * per_hour {
                recent.pop_front();
            }
            // Newest first, so the Reserve of this slot's admission leads.
            due = (0..=POSTED_HOURS + 1)
                .filter_map(|j| {
                    let back = j * per_hour;
                    let i = recent.len().checked_sub(back + 1)?;
                    recent[i].next()
                })
                .collect();
            due.reverse();
            slot += 1;
        }
        due.pop()
    });
    grants.into_iter().chain(slots).take(count)
}

/// Admissions per (synthetic) hour in [`synthetic_entries`].
const BENCH_ADMISSIONS_PER_HOUR: usize = 200;

/// The SplitMix64 finaliser: a cheap, well-mixed 64-bit hash.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A version-4 UUID, deterministic in (`seed`, `n`).
fn uuid_like(seed: u64, n: u64) -> String {
    let hi = splitmix64(seed ^ n);
    let lo = splitmix64(hi ^ n.rotate_left(32));
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xffff,
        hi & 0xfff,
        0x8000 | ((lo >> 48) & 0x3fff),
        lo & 0xffff_ffff_ffff
    )
}

/// Resident memory of this process now, in KiB (`VmRSS`).
fn rss_kib() -> Option<u64> {
    memory_kib("VmRSS")
}

async fn bench(url: &str, entries: usize, batch: usize) -> Result<(), String> {
    let store = Store::open(url).await.map_err(|e| e.to_string())?;
    let run = format!("bench{}", jiff::Timestamp::now().as_millisecond());
    let mut it = synthetic_entries(&run, entries).peekable();
    let mut first_batch = Vec::new();
    // The rate of each tenth of the run (each million at 10M), so a store that
    // slows as it grows shows it.
    let step = (entries / 10).max(batch);
    let t = Instant::now();
    let mut n = 0usize;
    let mut step_start = (Instant::now(), 0usize);
    let mut last_step_rate = 0.0;
    while it.peek().is_some() {
        let chunk: Vec<Entry> = it.by_ref().take(batch).collect();
        let out = store.append(&chunk).await.map_err(|e| e.to_string())?;
        n += out.inserted;
        if first_batch.is_empty() {
            first_batch = chunk;
        }
        if n - step_start.1 >= step || it.peek().is_none() {
            let secs = step_start.0.elapsed().as_secs_f64();
            last_step_rate = (n - step_start.1) as f64 / secs;
            println!(
                "append: entries {}..{n}: {last_step_rate:.0} entries/s",
                step_start.1
            );
            step_start = (Instant::now(), n);
        }
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "append: {n} entries in {secs:.2} s = {:.0} entries/s overall, {last_step_rate:.0} entries/s over the last {} (batches of {batch}, one transaction each)",
        n as f64 / secs,
        step.min(n)
    );
    // One entry per transaction, each durable when append returns: the latency
    // of a lone reservation on a full store.
    let mut lone: Vec<f64> = Vec::with_capacity(1000);
    for e in synthetic_entries(&format!("{run}-lone"), 1000) {
        let t = Instant::now();
        store
            .append(std::slice::from_ref(&e))
            .await
            .map_err(|e| e.to_string())?;
        lone.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    lone.sort_by(f64::total_cmp);
    let pct = |p: f64| lone[((lone.len() as f64 * p).ceil() as usize).clamp(1, lone.len()) - 1];
    println!(
        "single-entry durable append ({} appends): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        lone.len(),
        pct(0.50),
        pct(0.99),
        pct(1.0)
    );
    let replay = store
        .append(&first_batch)
        .await
        .map_err(|e| e.to_string())?;
    println!(
        "replay of the first batch: inserted {}, duplicates {}",
        replay.inserted, replay.duplicates
    );
    for format in [ExportFormat::Csv, ExportFormat::Focus] {
        let rss_before = rss_kib().unwrap_or(0);
        let peak_before = peak_rss_kib().unwrap_or(0);
        let t = Instant::now();
        let rows = export(
            &store,
            &EntryFilter::default(),
            format,
            Pricing::new("EUR", "0.5").map_err(|e| e.to_string())?,
            Parties::default(),
            std::io::BufWriter::new(std::io::sink()),
        )
        .await?;
        let secs = t.elapsed().as_secs_f64();
        println!(
            "export {}: {rows} rows from the whole store in {secs:.2} s = {:.0} rows/s; RSS {} KiB before, peak (VmHWM) {} KiB before, {} KiB after",
            format!("{format:?}").to_lowercase(),
            rows as f64 / secs,
            rss_before,
            peak_before,
            peak_rss_kib().unwrap_or(0)
        );
    }
    let t = Instant::now();
    let report = verify(&store).await.map_err(|e| e.to_string())?;
    println!(
        "verify: {} entries, {} problems, in {:.2} s; peak RSS (VmHWM) {} KiB after",
        report.entries,
        report.problems.len(),
        t.elapsed().as_secs_f64(),
        peak_rss_kib().unwrap_or(0)
    );
    Ok(())
}
