//! The budget loop: period grants, expiries and top-ups, balances for the
//! status and the planner, and the reconciliation of open reservations against
//! Kueue.

use super::workload_cache::{ledger_relevant, slim_view};
use super::*;
use crate::ledger::budget::PeriodWindow;

/// The least time between the starts of two budget passes. Appends wake the
/// loop so that exhaustion is seen at once, not a whole interval later; at 10
/// Workloads a second that is dozens of wake-ups a second, each a pass over
/// every budget and the open reservations.
const WOKEN_PASS_MIN_GAP: Duration = Duration::from_secs(1);

impl LedgerRuntime {
    pub(super) async fn budget_loop(
        self: Arc<Self>,
        workloads: Cache<Workload>,
        relevant: Arc<RelevantWorkloads>,
        cluster_queues: ManagedCache,
        retrigger: UnboundedSender<()>,
    ) {
        // The reconciliation compares the ledger with the Workload cache: before it
        // is filled, every open reservation would look orphaned.
        let _ = workloads.wait_until_ready().await;
        let _ = cluster_queues.wait_until_ready().await;
        let mut tick =
            tokio::time::interval(Duration::from_secs(self.config.budget_interval_seconds));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let min_gap = WOKEN_PASS_MIN_GAP.min(tick.period());
        let mut last_pass: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = self.shared.budget_pass_due.notified() => {}
            }
            // Under churn every append wakes the loop; the wake-ups of one gap
            // are served by one pass.
            if let Some(last) = last_pass {
                tokio::time::sleep_until(last + min_gap).await;
            }
            last_pass = Some(tokio::time::Instant::now());
            let pricing = self.shared.pricing();
            if !pricing.ready {
                continue;
            }
            let started = std::time::Instant::now();
            let cpu_started = crate::controller::metrics::process_cpu_seconds();
            let before = self.shared.budget_views();
            // Grants, top-ups and expiries carry no workload: one query per pass
            // finds those of every budget (a few per period each).
            let budget_level = self.store().entries_for_workload("").await.map(|rows| {
                let mut by_budget: BTreeMap<String, BTreeMap<String, Entry>> = BTreeMap::new();
                for s in rows {
                    by_budget
                        .entry(s.entry.budget.clone())
                        .or_default()
                        .insert(s.entry.key.clone(), s.entry);
                }
                by_budget
            });
            let mut views = BTreeMap::new();
            for (name, spec) in &pricing.budgets {
                // As the planner parsed it; an invalid budget is granted nothing
                // and says why.
                let parsed = pricing
                    .budget_amounts
                    .get(name)
                    .ok_or_else(|| pricing.budget_problem(name));
                // (store unreachable, message) on failure.
                let tick = match &budget_level {
                    Ok(by_budget) => {
                        let none = BTreeMap::new();
                        let known = by_budget.get(name).unwrap_or(&none);
                        let policy = spec.on_exhaustion;
                        self.budget_tick(name, parsed, policy, known)
                            .await
                            .map_err(|e| {
                                let unreachable =
                                    matches!(&e, LedgerError::Store(s) if store_unreachable(s));
                                (unreachable, e.to_string())
                            })
                    }
                    Err(e) => Err((store_unreachable(e), format!("ledger store: {e}"))),
                };
                let view = match tick {
                    Ok(view) => {
                        self.metrics.ledger_up.set(1);
                        view
                    }
                    Err((unreachable, message)) => {
                        if unreachable {
                            self.metrics.ledger_up.set(0);
                        }
                        tracing::warn!(budget = %name, error = %message, "budget ledger pass failed; retrying");
                        let mut view = before.get(name).cloned().unwrap_or_default();
                        view.error = Some(message);
                        view
                    }
                };
                self.metrics
                    .budget_remaining
                    .get_or_create(&BudgetLabel {
                        budget: name.clone(),
                    })
                    .set(i64::try_from(view.balances.remaining()).unwrap_or(i64::MAX));
                views.insert(name.clone(), view);
            }
            match self
                .reconcile_with_kueue(&pricing, &workloads, &relevant, &cluster_queues)
                .await
            {
                Ok(findings) => {
                    for (name, view) in views.iter_mut() {
                        view.drift = findings.get(name).cloned().unwrap_or_default();
                        self.metrics
                            .ledger_drift
                            .get_or_create(&BudgetLabel {
                                budget: name.clone(),
                            })
                            .set(view.drift.len() as i64);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reconciliation against Kueue failed; retrying")
                }
            }
            self.metrics
                .budget_pass_duration
                .observe(started.elapsed().as_secs_f64());
            self.metrics
                .budget_pass_cpu
                .observe(crate::controller::metrics::process_cpu_seconds() - cpu_started);
            let credits_returned = views.iter().any(|(name, v)| {
                before
                    .get(name)
                    .is_none_or(|b| v.balances.remaining() > b.balances.remaining())
            });
            if views != before {
                *self.shared.budgets.write().expect("budgets lock") = views;
                let _ = self.wake_planner.send(());
            }
            if credits_returned {
                // A top-up, a new period or a settlement: waiting Workloads may fit.
                let _ = retrigger.send(());
            }
        }
    }

    /// Grants, expiries and top-ups due now, then the budget's figures.
    /// `budget`: the budget as the planner parsed it, or why it did not parse
    /// (then nothing is granted and the view carries that as its error).
    /// `known`: the budget's grants, top-ups and expiries, by key.
    pub(super) async fn budget_tick(
        &self,
        name: &str,
        budget: Result<&ParsedBudget, String>,
        on_exhaustion: ExhaustionPolicy,
        known: &BTreeMap<String, Entry>,
    ) -> Result<BudgetLedgerView, LedgerError> {
        let now = now_seconds();
        let store = self.store();
        let window = budget
            .as_ref()
            .ok()
            .and_then(|b| current_period(&b.period, now));
        let before = self
            .reserves_appended
            .load(std::sync::atomic::Ordering::SeqCst);
        let balances = store.balances(name).await?;
        let mut error = None;
        let mut balances = balances;
        let entries = budget.and_then(|b| {
            budget_entries(name, b, now, &|k: &str| known.get(k).cloned(), balances)
                .map_err(|e| e.to_string())
        });
        match entries {
            Ok(entries) if !entries.is_empty() => {
                self.append(&entries).await?;
                balances = store.balances(name).await?;
            }
            Ok(_) => {}
            Err(e) => error = Some(e),
        }
        {
            // The store's figures become the cache's, unless a Reserve went in
            // meanwhile (then the next pass refreshes).
            let _guard = self.reserve_lock.lock().await;
            if self
                .reserves_appended
                .load(std::sync::atomic::Ordering::SeqCst)
                == before
            {
                self.balances
                    .lock()
                    .expect("balances lock")
                    .insert(name.to_string(), balances);
            }
        }
        let posted = store.posted_between(name, now - 86_400, now + 1).await?;
        Ok(budget_view(
            balances,
            posted,
            now - now.rem_euclid(3600),
            window,
            on_exhaustion,
            error,
        ))
    }

    /// Open reservations against Workloads holding quota, and device units per
    /// (ClusterQueue, flavor) against Kueue's reservations. A finding seen at two
    /// passes in a row is drift: an orphaned reservation is closed with a Void
    /// entry that says why, and every finding goes to the budget's condition and
    /// the drift metric.
    pub(super) async fn reconcile_with_kueue(
        &self,
        pricing: &PricingSnapshot,
        workloads: &Cache<Workload>,
        relevant: &RelevantWorkloads,
        cluster_queues: &ManagedCache,
    ) -> Result<BTreeMap<String, Vec<String>>, LedgerError> {
        let open = self.store().open_reservations().await?;
        self.metrics
            .ledger_open_reservations
            .set(i64::try_from(open.len()).unwrap_or(i64::MAX));
        let ours = super::workload_cache::Ours::of(&self.config);
        // Only Workloads the comparison can count (a charged one carries the
        // finalizer; one waiting on the check holds quota), looked up by the index
        // the watch keeps: finished history, which a cluster keeps by the ten
        // thousand, is not even visited.
        let relevant: Vec<Arc<Workload>> = relevant
            .keys()
            .iter()
            .filter_map(|key| workloads.get(key))
            .filter(|w| ledger_relevant(w, &ours))
            .collect();
        // Typed from the cached text: only names, labels and what Kueue holds.
        let queues: Vec<crate::kueue::ClusterQueueReservations> = cluster_queues
            .state()
            .iter()
            .filter_map(|q| {
                q.read()
                    .inspect_err(|e| {
                        tracing::warn!(queue = %q.name, error = %e, "ClusterQueue not compared with the ledger: its status does not parse")
                    })
                    .ok()
            })
            .collect();
        let found = crate::ledger::drift::compare(
            &open,
            &relevant,
            &queues,
            &pricing
                .queues
                .iter()
                .map(|(q, (budget, _))| (q.clone(), budget.clone()))
                .collect(),
            &self.config.admission_check_name,
        );
        let mut findings: BTreeMap<String, Vec<(String, Option<OpenReservation>)>> =
            BTreeMap::new();
        for f in found {
            findings
                .entry(f.budget)
                .or_default()
                .push((f.message, f.orphan));
        }

        let mut previous = self.previous_findings.lock().await;
        let (confirmed, seen) = confirmed_findings(&previous, findings);
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (budget, list) in confirmed {
            for (text, orphan) in list {
                if let Some(r) = &orphan {
                    self.close_orphan(r).await?;
                }
                out.entry(budget.clone()).or_default().push(text);
            }
        }
        *previous = seen;
        Ok(out)
    }

    /// Closes a reservation whose Workload is gone (its finalizer was removed by
    /// hand, or the ledger was restored from a backup): what was posted stands,
    /// the rest is voided by an entry that says so.
    pub(super) async fn close_orphan(&self, r: &OpenReservation) -> Result<(), LedgerError> {
        let e = &r.reserve.entry;
        // Closing is final: ask the API server, not the cache, whether it is gone.
        let api: Api<Workload> = Api::namespaced(self.client.clone(), &e.namespace);
        match api.get_opt(&e.workload).await {
            Ok(Some(mut w)) if w.uid().as_deref() == Some(e.workload_uid.as_str()) => {
                // Still there, but not charged by kaccel's finalizer any more
                // (removed by hand before settlement): settle it from the whole
                // object, as its own reconcile would have, since the cache keeps
                // a finished, unfinalized Workload as identity only.
                slim_view(&mut w);
                if w.is_true("Finished") || w.metadata.deletion_timestamp.is_some() {
                    tracing::warn!(key = %e.key, "settling a finished Workload whose finalizer was removed before its settlement");
                    self.reconcile_workload(Arc::new(w)).await?;
                } else {
                    tracing::info!(key = %e.key, "reservation looked orphaned but its Workload exists; left open");
                }
                return Ok(());
            }
            Ok(_) => {}
            Err(source) => {
                return Err(LedgerError::Api {
                    action: format!(
                        "checking Workload {}/{} before closing its reservation",
                        e.namespace, e.workload
                    ),
                    source,
                });
            }
        }
        let rest = r.open();
        let mut void = e.clone();
        void.key = void_key(&e.line());
        void.kind = EntryKind::Void;
        void.start = r.posted_until.max(e.start);
        void.end = void.start;
        void.credits = i64::try_from(rest.max(0)).unwrap_or(0);
        void.reason = format!(
            "reconciliation: Workload {}/{} is gone without settlement; usage after {} is not charged ({} credits released)",
            e.namespace,
            e.workload,
            rfc3339(void.start),
            format_micros(rest.max(0))
        );
        void.created_at = now_seconds();
        tracing::warn!(key = %e.key, "closing an orphaned reservation");
        self.append(&[void]).await
    }
}

/// A budget's figures for its status and the planner, from its balances and
/// what it posted over the last 24 hours.
fn budget_view(
    balances: Balances,
    posted_last_24h: i128,
    now: i64,
    window: Option<PeriodWindow>,
    on_exhaustion: ExhaustionPolicy,
    error: Option<String>,
) -> BudgetLedgerView {
    let burn = burn_rate_per_hour(posted_last_24h);
    BudgetLedgerView {
        balances,
        burn_per_hour: burn,
        // Projected from the start of the hour, so the status (and its write)
        // changes only when the figures do, or once an hour, not every pass.
        projected_exhaustion: projected_exhaustion(
            now - now.rem_euclid(3600),
            balances.remaining(),
            burn,
        ),
        period: window.map(|w| (w.start, w.end)),
        exhausted: is_exhausted(on_exhaustion, &balances),
        error,
        drift: vec![],
    }
}

/// Findings of one pass, per budget: text, and the orphaned reservation to
/// close when it is confirmed.
type Findings = BTreeMap<String, Vec<(String, Option<OpenReservation>)>>;

/// Drift is a finding seen at two passes in a row (a Workload between two
/// writes looks like drift for one pass): the findings of this pass that the
/// previous pass saw too, and the set this pass saw, for the next one.
fn confirmed_findings(
    previous: &BTreeSet<String>,
    findings: Findings,
) -> (Findings, BTreeSet<String>) {
    let seen: BTreeSet<String> = findings
        .values()
        .flatten()
        .map(|(text, _)| text.clone())
        .collect();
    let confirmed = findings
        .into_iter()
        .filter_map(|(budget, list)| {
            let list: Vec<_> = list
                .into_iter()
                .filter(|(text, _)| previous.contains(text))
                .collect();
            (!list.is_empty()).then_some((budget, list))
        })
        .collect();
    (confirmed, seen)
}

#[cfg(test)]
mod tests;
