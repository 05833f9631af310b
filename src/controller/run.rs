//! The process around the reconcile: startup, leader election, the paced loop, shutdown.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use kube::Client;
use kube::runtime::events::{Recorder, Reporter};
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use super::diff::Kind;
use super::metrics::{Metrics, ReasonLabel, StageLabel};
use super::reconcile::{LedgerParts, Reconciler};
use super::watches::{Caches, Events, WakeUps, driven, start_watches};
use super::{Config, Error, allocator, credits, health_poller, http, pod_webhook};

/// Run the controller until SIGTERM / Ctrl-C.
pub async fn run(config: Config) -> Result<(), Error> {
    let client = Client::try_default()
        .await
        .map_err(|e| Error::Connect(e.to_string()))?;
    // Before anything is watched or written: an older Kueue would silently prune
    // fields kaccel applies.
    super::kueue_check::check_kueue(&client).await?;
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let ready = Arc::new(AtomicBool::new(false));
    let (shutdown_tx, shutdown_rx) = watch::channel(false);

    let tracker = health_poller::tracker(&config.health);
    let held_rules = http::SharedHeldRules::default();
    let http_state = http::HttpState {
        registry: Arc::new(registry),
        ready: ready.clone(),
        tracker: tracker.clone(),
        held_rules: held_rules.clone(),
    };
    let address = config.http_address;
    let mut http_shutdown = shutdown_rx.clone();
    let http_task = tokio::spawn(async move {
        http::serve(address, http_state, async move {
            let _ = http_shutdown.wait_for(|s| *s).await;
        })
        .await
        .map_err(|source| Error::Http { address, source })
    });

    // The pod webhook answers on every replica: the API server may call any.
    let webhook_task = config.webhook.enabled.then(|| {
        let (client, webhook, metrics) = (client.clone(), config.webhook.clone(), metrics.clone());
        let instance = config.instance.clone();
        let credits = config.ledger.enabled.then(|| pod_webhook::CreditsHook {
            finalizer: config.ledger.finalizer.clone(),
            check: config.ledger.admission_check_name.clone(),
        });
        let mut webhook_shutdown = shutdown_rx.clone();
        tokio::spawn(async move {
            // Fails closed: while it cannot serve, the API server refuses the pods
            // it is registered for (and creates Workloads without the finalizer,
            // which the credit check then writes itself); planning and the
            // ledger carry on.
            let shutdown = async move {
                let _ = webhook_shutdown.wait_for(|s| *s).await;
            };
            if let Err(e) =
                pod_webhook::serve(client, webhook, instance, metrics, credits, shutdown).await
            {
                tracing::error!(error = %e, "the pod webhook stopped");
            }
        })
    });

    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down");
        let _ = shutdown_tx.send(true);
    });

    let trim = allocator::TrimRequests::default();
    tokio::spawn(allocator::trim_when_asked(trim.clone(), metrics.clone()));
    let own_writes = super::watches::OwnWrites::default();
    let (caches, watch_events) = start_watches(&client, &config, &own_writes).await?;
    // Health pollers wake the reconcile loop like a watch event does.
    let (wake_tx, wake_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let ledger = config.ledger.enabled.then(|| {
        let shared = Arc::new(credits::LedgerShared::default());
        LedgerParts {
            runtime: credits::LedgerRuntime::new(
                client.clone(),
                config.ledger.clone(),
                &config.instance,
                &config.field_manager,
                metrics.clone(),
                shared.clone(),
                wake_tx.clone(),
                tracker.clone(),
            ),
            shared,
        }
    });
    let workers = super::multikueue::watch_workers(&client, &config.multi_kueue, wake_tx.clone());
    health_poller::spawn_pollers(
        &client,
        &config.health,
        tracker.clone(),
        metrics.clone(),
        wake_tx,
    );
    // Who holds each device: the pods exporters attribute devices to, and on DRA
    // nodes the pods ResourceClaims are reserved for (read-only).
    let claims = caches.slices.as_ref().map(|_| {
        let (store, events) = super::watches::watch_claims(&client);
        tokio::spawn(events.for_each(|e| async move {
            if let Err(e) = e {
                tracing::debug!(error = %e, "ResourceClaim watch");
            }
        }));
        store
    });
    if !config.health.sources.is_empty() || claims.is_some() {
        tokio::spawn(super::holders::run(
            client.clone(),
            tracker.clone(),
            claims,
            caches.slices.clone(),
        ));
    }
    let health_events = tokio_stream_from(wake_rx);
    let wake_ups = driven(stream::select(watch_events, health_events).boxed());
    let identity = std::env::var("POD_NAME")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "kaccel".into());
    let reconciler = Reconciler {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: config.instance.clone(),
                instance: Some(identity.clone()),
            },
        ),
        client: client.clone(),
        config: config.clone(),
        metrics: metrics.clone(),
        health: tracker,
        held_back: Default::default(),
        requeue_pending: AtomicBool::new(config.health.actions.evict_workloads_on_failed),
        evictions_pending: AtomicBool::new(config.health.actions.evict_workloads_on_failed),
        next_eviction_check: std::sync::Mutex::new(0),
        namespaces_missing: AtomicBool::new(false),
        names_taken: AtomicBool::new(false),
        node_reads_seen: Default::default(),
        trim,
        in_sync: Default::default(),
        carried: Default::default(),
        own_writes,
        // Each source's first poll ends within its timeout (plus the poller's
        // start): until then, or until every source answered or failed, the
        // planner would see its cards unread.
        health_warm_until: Instant::now()
            + Duration::from_secs(
                config
                    .health
                    .sources
                    .iter()
                    .map(|s| s.timeout_seconds)
                    .max()
                    .map_or(0, |t| t + 2),
            ),
        health_warming: AtomicBool::new(false),
        held_rules,
        ledger,
        workers,
    };

    let result = if config.leader_election.enabled {
        lead_then_reconcile(
            &client,
            &config,
            &identity,
            reconciler,
            caches,
            wake_ups,
            ready,
            shutdown_rx.clone(),
        )
        .await
    } else {
        metrics.leader.set(1);
        reconcile_loop(
            reconciler,
            caches,
            wake_ups,
            ready,
            shutdown_rx.clone(),
            None,
        )
        .await
    };
    // Stop the HTTP server too, whatever ended the loop.
    http_task.abort();
    if let Some(task) = webhook_task {
        task.abort();
    }
    result
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler installs");
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

#[allow(clippy::too_many_arguments)]
async fn lead_then_reconcile(
    client: &Client,
    config: &Config,
    identity: &str,
    reconciler: Reconciler,
    caches: Caches,
    wake_ups: WakeUps,
    ready: Arc<AtomicBool>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), Error> {
    let le = &config.leader_election;
    let namespace = std::env::var("POD_NAMESPACE").unwrap_or_else(|_| le.lease_namespace.clone());
    tracing::info!(lease = %le.lease_name, %namespace, %identity, "waiting for leadership");
    // Caches fill while waiting, so a new leader acts at once.
    let cache_ready = ready.clone();
    let caches_for_ready = caches.clone();
    tokio::spawn(async move {
        caches_for_ready.wait_until_ready().await;
        cache_ready.store(true, Ordering::Relaxed);
    });
    // A Lease kaccel may not create or read (a namespace its Role does not cover)
    // is an operator's mistake to fix, not a reason to exit: exiting would only
    // crash-loop. It is logged with the fix, counted, and retried with backoff
    // while /healthz answers and the caches stay warm.
    let mut backoff = Duration::from_secs(1);
    let manager = loop {
        let built = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &le.lease_name)
            .with_namespace(&namespace)
            .with_identity(identity)
            .with_duration(le.lease_duration_seconds)
            .with_grace(le.renew_grace_seconds)
            // Each replica needs its own field manager: kube-lease-manager relies on
            // server-side apply conflicts between managers to keep a single holder.
            .with_field_manager(format!("{}-lease-{identity}", config.field_manager))
            .build()
            .await;
        let error = match built {
            Ok(manager) => break manager,
            Err(e) => e,
        };
        let forbidden = matches!(
            &error,
            kube_lease_manager::LeaseManagerError::KubeError(kube::Error::Api(status)) if status.code == 403
        );
        let reason = if forbidden { "Forbidden" } else { "Error" };
        reconciler
            .metrics
            .leader_election_failures
            .get_or_create(&super::metrics::ReasonLabel {
                reason: reason.into(),
            })
            .inc();
        if forbidden {
            tracing::error!(
                lease = %le.lease_name, %namespace, error = %error, retry_in = ?backoff,
                "may not create or read the leader-election Lease: manifests/role.yaml grants kaccel the Lease kaccel-controller in its own namespace (POD_NAMESPACE); set leaderElection.leaseNamespace / leaseName to match, or grant the Role where the Lease is"
            );
        } else {
            tracing::warn!(lease = %le.lease_name, %namespace, error = %error, retry_in = ?backoff, "cannot set up the leader-election Lease");
        }
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return Ok(()),
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(30));
    };
    let (mut is_leader, lease_task) = manager.watch().await;
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => {
                drop(is_leader);
                // Dropping the channel makes the lease task release the Lease.
                let _ = lease_task.await;
                return Ok(());
            }
            changed = is_leader.changed() => {
                if changed.is_err() {
                    return Err(Error::LeaderElection("lease task ended".into()));
                }
                if *is_leader.borrow_and_update() {
                    break;
                }
            }
        }
    }
    tracing::info!(%identity, "became leader");
    reconciler.metrics.leader.set(1);
    let deadline = renew_deadline(
        client.clone(),
        namespace.clone(),
        le.lease_name.clone(),
        identity.to_string(),
        le.lease_duration_seconds,
        le.renew_grace_seconds,
    );
    let lost = async move {
        tokio::select! {
            _ = is_leader.wait_for(|l| !*l) => {}
            _ = deadline => {}
        }
    };
    let result = reconcile_loop(
        reconciler,
        caches,
        wake_ups,
        ready,
        shutdown.clone(),
        Some(Box::pin(lost)),
    )
    .await;
    // Returning drops the channel: the lease task releases the Lease for a fast
    // handover. Not waited for long: after failed renewals it may be sleeping
    // out a backoff, and a leader that stepped down should be gone.
    let _ = tokio::time::timeout(Duration::from_secs(2), lease_task).await;
    result
}

/// Resolves when this leader must stop writing: the Lease names another holder,
/// or it could not be seen renewed for so long that another replica may soon
/// take it. The lease manager keeps believing it leads while the API server
/// does not answer (it learns of a new holder only once it can read the Lease
/// again), so without this deadline an outage longer than the lease would let
/// a standby lead beside a leader that still writes as soon as both reach the
/// API server. Read once a second (`get` on the one Lease, which the Role
/// grants).
async fn renew_deadline(
    client: Client,
    namespace: String,
    lease_name: String,
    identity: String,
    duration_seconds: u64,
    grace_seconds: u64,
) {
    use k8s_openapi::api::coordination::v1::Lease;
    let leases: kube::Api<Lease> = kube::Api::namespaced(client, &namespace);
    // Until the first read, leadership counts from now (it was just won).
    let mut renewed = k8s_openapi::jiff::Timestamp::now();
    let left = |renewed: k8s_openapi::jiff::Timestamp| {
        let since = k8s_openapi::jiff::Timestamp::now().as_millisecond() - renewed.as_millisecond();
        lease_time_left(since, duration_seconds, grace_seconds)
    };
    loop {
        // A read a second, never past the deadline: the step-down is on time
        // however slow the API server answers.
        tokio::time::sleep(left(renewed).min(Duration::from_secs(1))).await;
        let budget = left(renewed).min(Duration::from_secs(1));
        if !budget.is_zero() {
            match tokio::time::timeout(budget, leases.get(&lease_name)).await {
                Ok(Ok(lease)) => {
                    let spec = lease.spec.unwrap_or_default();
                    if spec.holder_identity.as_deref() != Some(identity.as_str()) {
                        tracing::warn!(lease = %lease_name, holder = ?spec.holder_identity, "the Lease names another holder");
                        return;
                    }
                    if let Some(at) = spec.renew_time.or(spec.acquire_time) {
                        renewed = renewed.max(at.0);
                    }
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "reading the Lease"),
                Err(_) => tracing::debug!("reading the Lease timed out"),
            }
        }
        if left(renewed).is_zero() {
            tracing::warn!(
                lease = %lease_name,
                last_renewed = %renewed,
                "the Lease was not renewed in time: stepping down before another replica may take it"
            );
            return;
        }
    }
}

/// How long a leader whose Lease was last seen renewed `since_renew_ms` ago may
/// still write: until a fifth of the lease (at least a second) before it
/// expires, so it has stopped before a standby can see it expired. The lease
/// manager renews `grace_seconds` before expiry and retries a failed renewal
/// after 1, 2, 4 ... s: with the defaults (15 s, grace 10) it renews 5 s into
/// the lease and has 7 s to get one renewal through.
fn lease_time_left(since_renew_ms: i64, duration_seconds: u64, grace_seconds: u64) -> Duration {
    let duration_ms = duration_seconds * 1000;
    let margin_ms = (duration_ms / 5).max(1000);
    // Never before the first renewal is even due.
    let limit_ms = duration_ms
        .saturating_sub(margin_ms)
        .max(duration_ms.saturating_sub(grace_seconds * 1000));
    let since = u64::try_from(since_renew_ms).unwrap_or(0);
    Duration::from_millis(limit_ms.saturating_sub(since))
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The wake-ups sent on `rx`, as a stream.
pub(super) fn receiver_stream(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<()>,
) -> impl futures::Stream<Item = ()> + Send + 'static {
    stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// The wake-ups sent on `rx`, as reconcile events.
fn tokio_stream_from(rx: tokio::sync::mpsc::UnboundedReceiver<()>) -> Events {
    receiver_stream(rx).map(Ok).boxed()
}

/// When a re-plan starts once something changed (config `quietMs`, `debounceMs`,
/// `maxDelayMs`).
#[derive(Clone, Copy, Debug)]
struct Pace {
    /// Quiet after the last event: the events of one change become one plan.
    quiet: Duration,
    /// Least time between two starts: a stream of events re-plans at this pace.
    spacing: Duration,
    /// Longest a stream of events may hold a re-plan back after the first one.
    max_delay: Duration,
}

impl Pace {
    /// The start of the next re-plan; None while nothing is pending. A lone change
    /// after a calm waits `quiet` only, so one Node's label reaches its quota in
    /// milliseconds, not after a fixed debounce.
    fn next_start(
        &self,
        dirty_since: Option<Instant>,
        last_event: Instant,
        last_start: Option<Instant>,
    ) -> Option<Instant> {
        let first = dirty_since?;
        let quiet_after = last_event + self.quiet;
        let paced = match last_start {
            Some(start) => quiet_after.max(start + self.spacing),
            None => quiet_after,
        };
        Some(paced.min(first + self.max_delay).max(first))
    }
}

async fn reconcile_loop(
    reconciler: Reconciler,
    caches: Caches,
    mut wake_ups: WakeUps,
    ready: Arc<AtomicBool>,
    mut shutdown: watch::Receiver<bool>,
    mut lost_leadership: Option<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>>,
) -> Result<(), Error> {
    // The caches fill on their own (`driven`); a wake-up left from the sync is
    // one, and the first plan follows it anyway.
    tokio::select! {
        _ = caches.wait_until_ready() => {}
        _ = shutdown.wait_for(|s| *s) => return Ok(()),
    }
    ready.store(true, Ordering::Relaxed);
    tracing::info!("caches synced");
    // Kueue's MultiKueue objects, written once per leadership.
    let _multikueue_task = reconciler.config.multi_kueue.enabled().then(|| {
        let config = &reconciler.config;
        AbortOnDrop(tokio::spawn(super::multikueue::write_objects(
            reconciler.client.clone(),
            config.multi_kueue.clone(),
            config.instance.clone(),
            config.field_manager.clone(),
        )))
    });
    // The ledger's tasks run while this loop does (the leader's), and stop with it.
    let _ledger_task = reconciler.ledger.as_ref().map(|l| {
        let cluster_queues = caches.kueue[&Kind::ClusterQueue].clone();
        AbortOnDrop(tokio::spawn(l.runtime.clone().run(cluster_queues)))
    });

    let pace = Pace {
        quiet: reconciler.config.quiet(),
        spacing: reconciler.config.debounce(),
        max_delay: reconciler.config.max_delay(),
    };
    let mut dirty_since: Option<Instant> = Some(Instant::now());
    let mut last_event = Instant::now();
    let mut last_start: Option<Instant> = None;
    let mut resync = tokio::time::interval(reconciler.config.resync());
    resync.tick().await;
    loop {
        let deadline = pace.next_start(dirty_since, last_event, last_start);
        let sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d.into()).await,
                None => std::future::pending().await,
            }
        };
        let lost = async {
            match lost_leadership.as_mut() {
                Some(l) => l.await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return Ok(()),
            _ = lost => {
                tracing::warn!("lost leadership: stopping writes");
                reconciler.metrics.leader.set(0);
                return Err(Error::LeaderElection("lost the Lease".into()));
            }
            woken = wake_ups.next() => match woken {
                Some(()) => {
                    last_event = Instant::now();
                    dirty_since.get_or_insert(last_event);
                }
                None => return Err(Error::Connect("watch streams ended".into())),
            },
            _ = resync.tick() => { dirty_since.get_or_insert(Instant::now()); }
            _ = sleep => {
                let started = Instant::now();
                if let Some(first) = dirty_since.take() {
                    let pending = started.saturating_duration_since(first).as_secs_f64();
                    reconciler
                        .metrics
                        .reconcile_stage
                        .get_or_create(&StageLabel { stage: "pending" })
                        .observe(pending);
                    tracing::debug!(target: "kaccel::replan", "re-plan starts {:.1} ms after its first event", pending * 1000.0);
                }
                last_start = Some(started);
                reconciler.metrics.reconciles.inc();
                if let Err(e) = reconciler.reconcile(&caches).await {
                    tracing::warn!(error = %e, "reconcile failed; retrying");
                    reconciler.metrics.reconcile_failures.get_or_create(&ReasonLabel { reason: e.metric_label().into() }).inc();
                    // Retry after a pause rather than spinning.
                    dirty_since = Some(Instant::now() + Duration::from_secs(1));
                    last_event = Instant::now() + Duration::from_secs(1);
                }
                reconciler.metrics.reconcile_duration.observe(started.elapsed().as_secs_f64());
                reconciler.trim.request();
                if reconciler.own_writes.take_missed() {
                    // A change held back while kaccel's own write of that object
                    // was in flight was someone else's.
                    last_event = Instant::now();
                    dirty_since.get_or_insert(last_event);
                }
                if dirty_since.is_none()
                    && (reconciler.namespaces_missing.load(Ordering::Relaxed)
                        || reconciler.names_taken.load(Ordering::Relaxed))
                {
                    // Namespaces and objects kaccel does not own are not watched:
                    // try again in a while.
                    dirty_since = Some(Instant::now() + Duration::from_secs(5));
                    last_event = Instant::now() + Duration::from_secs(5);
                }
                if dirty_since.is_none()
                    && (reconciler.requeue_pending.load(Ordering::Relaxed)
                        || reconciler.evictions_pending.load(Ordering::Relaxed)
                        || reconciler.health_warming.load(Ordering::Relaxed))
                {
                    // Kueue evicts asynchronously and Workloads are not watched: look again soon.
                    dirty_since = Some(Instant::now());
                    last_event = Instant::now() + Duration::from_millis(500);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_stops_before_its_lease_could_be_taken() {
        // 15 s lease, 10 s grace: renewed at 5 s; writes until 12 s unrenewed.
        assert_eq!(lease_time_left(5_000, 15, 10), Duration::from_secs(7));
        assert_eq!(lease_time_left(11_999, 15, 10), Duration::from_millis(1));
        assert!(lease_time_left(12_000, 15, 10).is_zero());
        assert!(lease_time_left(60_000, 15, 10).is_zero());
        // A short lease still stops a second before expiry.
        assert_eq!(lease_time_left(0, 6, 2), Duration::from_millis(4_800));
        assert!(lease_time_left(4_800, 6, 2).is_zero());
        assert_eq!(lease_time_left(0, 3, 1), Duration::from_secs(2));
        // A grace shorter than the margin: never before the renewal is due.
        assert_eq!(lease_time_left(0, 15, 1), Duration::from_secs(14));
        // A renewTime ahead of this clock counts as just renewed.
        assert_eq!(lease_time_left(-500, 6, 2), Duration::from_millis(4_800));
    }

    fn pace() -> Pace {
        Pace {
            quiet: Duration::from_millis(10),
            spacing: Duration::from_millis(250),
            max_delay: Duration::from_millis(2000),
        }
    }

    #[test]
    fn nothing_pending_starts_nothing() {
        let now = Instant::now();
        assert_eq!(pace().next_start(None, now, Some(now)), None);
    }

    #[test]
    fn a_lone_change_after_a_calm_waits_only_the_quiet_time() {
        let t0 = Instant::now();
        let last_start = t0;
        let event = t0 + Duration::from_secs(10);
        assert_eq!(
            pace().next_start(Some(event), event, Some(last_start)),
            Some(event + Duration::from_millis(10))
        );
        // The first plan after start-up, too.
        assert_eq!(
            pace().next_start(Some(t0), t0, None),
            Some(t0 + Duration::from_millis(10))
        );
    }

    #[test]
    fn a_change_soon_after_a_plan_waits_for_the_spacing() {
        let t0 = Instant::now();
        let event = t0 + Duration::from_millis(40);
        assert_eq!(
            pace().next_start(Some(event), event, Some(t0)),
            Some(t0 + Duration::from_millis(250))
        );
    }

    #[test]
    fn a_stream_of_events_is_held_back_no_longer_than_the_max_delay() {
        let t0 = Instant::now();
        let first = t0 + Duration::from_secs(1);
        // An event every 5 ms keeps the quiet time moving...
        let last_event = first + Duration::from_millis(1995);
        assert_eq!(
            pace().next_start(Some(first), last_event, Some(t0)),
            Some(first + Duration::from_millis(2000))
        );
        // ...and while it is short of the cap, the quiet time decides.
        let last_event = first + Duration::from_millis(500);
        assert_eq!(
            pace().next_start(Some(first), last_event, Some(t0)),
            Some(last_event + Duration::from_millis(10))
        );
    }

    #[test]
    fn a_retry_set_in_the_future_is_kept() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(1);
        assert_eq!(
            pace().next_start(Some(later), later, Some(t0)),
            Some(later + Duration::from_millis(10))
        );
    }

    #[tokio::test]
    async fn wake_ups_are_events_until_every_sender_is_gone() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut events = tokio_stream_from(rx);
        tx.send(()).unwrap();
        tx.send(()).unwrap();
        drop(tx);
        assert!(matches!(events.next().await, Some(Ok(()))));
        assert!(matches!(events.next().await, Some(Ok(()))));
        // The end of the stream is what makes the reconcile loop stop.
        assert!(events.next().await.is_none());
    }

    #[tokio::test]
    async fn dropping_the_guard_stops_its_task() {
        let (alive, gone) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _alive = alive;
            std::future::pending::<()>().await;
        });
        drop(AbortOnDrop(task));
        // The task's future, and with it the sender, is dropped when it is aborted.
        let ended = tokio::time::timeout(Duration::from_secs(5), gone).await;
        assert!(matches!(ended, Ok(Err(_))), "{ended:?}");
    }
}
