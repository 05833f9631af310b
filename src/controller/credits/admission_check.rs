//! The credit AdmissionCheck: one reconcile per Workload (reserve, post, renew,
//! settle, release the finalizer) and the check state the user reads.

use super::*;

impl LedgerRuntime {
    pub(super) async fn reconcile_workload(
        &self,
        obj: Arc<Workload>,
    ) -> Result<Action, LedgerError> {
        let v: &Workload = &obj;
        let namespace = obj.namespace().unwrap_or_default();
        let name = obj.name_any();
        let shown = format!("{namespace}/{name}");
        let uid = obj.uid().unwrap_or_default();
        let check = check_state(v, &self.config.admission_check_name);
        let finished = is_finished(v);
        let deleting = deletion_time(v).is_some();
        let pricing = self.shared.pricing();
        let has_finalizer = obj.has_finalizer(&self.config.finalizer);
        tracing::debug!(target: "kaccel::credit_check", workload = %shown, check = ?check.map(|c| c.0), quota = holds_quota(v), "reconcile");
        if check.is_none() && !has_finalizer {
            return Ok(Action::await_change());
        }
        let mut stored: Option<Vec<StoredEntry>> = None;
        let mut rebuilt = false;
        let mut record = match record_of(v).map_err(|message| LedgerError::BadWorkload {
            workload: shown.clone(),
            message: format!("{message}; remove the annotation to let kaccel charge it again"),
        })? {
            Some(record) => Some(record),
            // Charged, but the record is gone (removed by hand): the Reserve
            // entries say what the admission holds, so it is still settled
            // in full.
            None if has_finalizer => {
                let entries = self.store().entries_for_workload(&uid).await?;
                let record = ReservationRecord::from_reserve_entries(
                    entries.iter().map(|s| &s.entry),
                    v.cluster_queue().unwrap_or_default(),
                    |flavor| pricing.flavor_models.get(flavor).cloned(),
                );
                stored = Some(entries);
                rebuilt = record.is_some();
                record
            }
            None => None,
        };
        let now = now_seconds();
        let mut requeue: Option<i64> = None;

        // 1. The recorded admission: renewals and periodic posts while it runs, or
        // the settlement once it ended.
        let mut recorded: Option<(Charge, ChargeState)> = None;
        if let Some(rec) = record.as_mut() {
            let entries = match stored.take() {
                Some(entries) => entries,
                None => self.store().entries_for_workload(&uid).await?,
            };
            // Kueue stamped this admission's reservation again: charged from its
            // new time while nothing but the first term is written, the record
            // rewritten first so every later read agrees.
            if let Some(rebased) = rebased(
                rec,
                v,
                &self.config.admission_check_name,
                entries.iter().map(|s| &s.entry),
            ) {
                self.set_record(v, &rebased).await?;
                tracing::info!(workload = %shown, admission = rec.admission, from = rec.admitted_at, to = rebased.admitted_at, "Kueue stamped the quota reservation again; charging from its new time");
                *rec = rebased;
                rebuilt = false;
            }
            let mut charge = rec.charge(&namespace, &name, &uid);
            // The worker MultiKueue dispatched it to, named on every entry from here on.
            charge.cluster = v.cluster_name().to_string();
            charge.devices = self
                .devices
                .lock()
                .expect("tracker lock")
                .devices_held_by(&namespace, &name);
            let mut state = ChargeState::of(&charge, entries.iter().map(|s| &s.entry));
            if state.terms > 0 && !state.voided {
                let ended = ended_at(
                    v,
                    rec,
                    EVICTED_FOR_ANNOTATION,
                    &self.config.admission_check_name,
                )
                .map(|end| self.ends_seen.settle_with(&uid, rec.admission, end));
                match ended {
                    Some(end) => {
                        let mut out = charge.settle(&state, &end, now);
                        let refunds = pricing
                            .budgets
                            .get(&rec.budget)
                            .is_some_and(|b| b.admission.refund_preemption);
                        if refunds {
                            state.apply(&charge, &out);
                            out.extend(charge.preemption_refunds(&state.posted, &end));
                        }
                        self.append(&out).await?;
                        self.ends_seen.settled(&uid);
                        tracing::info!(workload = %shown, admission = rec.admission, ended = %end.reason, "settled");
                        // Credits came back: waiting Workloads may fit now.
                        let _ = self.wake_planner.send(());
                    }
                    None => {
                        // A Workload kaccel (or anyone) deactivated is on its way
                        // out: no renewal; what it still uses is charged as overrun.
                        let renews = v.active() && !is_bounded(v);
                        if renews && now >= charge.renewal_due_at(state.terms) {
                            self.renew(v, &charge, &mut state, &pricing, now).await?;
                        }
                        let (posts, next_post) =
                            charge.due_posts(&state, now, self.config.post_interval_seconds);
                        self.append(&posts).await?;
                        state.apply(&charge, &posts);
                        let next_renewal = charge.renewal_due_at(state.terms);
                        requeue = Some(if renews && next_renewal > now {
                            next_post.min(next_renewal)
                        } else {
                            next_post
                        });
                    }
                }
            }
            if state.terms > 0 {
                recorded = Some((charge, state));
            }
        }

        // 2. Answer a Pending check of a Workload holding quota, or one Kueue has
        // not listed yet on a Workload kaccel charges (its finalizer, from the
        // webhook) whose queue calls for it: in a burst Kueue's scheduler
        // reserves quota well before its Workload controller gets round to
        // listing the check (a write of its own, queued behind every other
        // Workload's), and once kaccel's answer is there that controller skips
        // the listing and admits in the same pass. Kueue's listing is a
        // resourceVersion-checked update, so it cannot overwrite the answer.
        let question = open_question(check, has_finalizer, holds_quota(v), || {
            self.queue_calls_for_check(v)
        });
        if question.is_none() || finished || deleting {
            self.forget_answered(&uid);
        }
        if let Some(message) = question
            && holds_quota(v)
            && !finished
            && !deleting
            && !evicted_since_admission(v)
        {
            let admission = admission_number(v).map_err(|source| LedgerError::Admission {
                workload: shown.clone(),
                source,
            })?;
            match (&record, &recorded) {
                (Some(_), Some(_)) if self.recently_answered(&uid, admission) => {
                    // The cache lags this process's own Ready write: look again
                    // once it should show.
                    let again = now + ANSWER_CACHE_LAG.as_secs() as i64;
                    requeue = Some(requeue.map_or(again, |r| r.min(again)));
                }
                (Some(rec), Some((charge, _))) if rec.admission == admission => {
                    // Reserved before a crash.
                    let usage = usage_from_workload(v).unwrap_or_default();
                    let placed = self.placement(v, &usage, &pricing);
                    let note = with_placed(ready_note(rec, charge, v), placed.as_deref());
                    self.set_check(v, "Ready", &note, None).await?;
                    self.note_answered(&uid, admission);
                }
                _ => {
                    let charge = Admission {
                        shown: &shown,
                        uid: &uid,
                        number: admission,
                        written: record.as_ref().filter(|_| !rebuilt),
                    };
                    if let Some(after) = self.decide(v, &charge, message, &pricing, now).await? {
                        requeue = Some(requeue.map_or(after, |r| r.min(after)));
                    }
                }
            }
        }

        // 3. A record rebuilt from the entries is written back while its
        // admission is open, once Kueue has admitted the Workload: a write while
        // Kueue turns the check's Ready into Admitted makes Kueue's
        // resourceVersion-checked update conflict and retry.
        if rebuilt
            && !finished
            && !deleting
            && v.is_true("Admitted")
            && let (Some(rec), Some((_, state))) = (&record, &recorded)
            && !state.voided
        {
            self.set_record(v, rec).await?;
        }

        // 4. The finalizer goes once a finished or deleted Workload is settled
        // (a failed settlement returned early above).
        if has_finalizer && (finished || deleting) {
            self.release(v).await?;
        }

        Ok(match requeue {
            Some(at) => Action::requeue(Duration::from_secs(
                at.saturating_sub(now).clamp(1, 3600) as u64
            )),
            None => Action::await_change(),
        })
    }

    /// Prices the admission and reserves, waits or rejects. Returns when to look
    /// again (unix seconds) while waiting.
    pub(super) async fn decide(
        &self,
        v: &Workload,
        admission: &Admission<'_>,
        current_message: &str,
        pricing: &PricingSnapshot,
        now: i64,
    ) -> Result<Option<i64>, LedgerError> {
        let Admission {
            shown,
            uid,
            number: admission,
            written,
        } = *admission;
        let retry_at = now + i64::from(self.config.retry_after_seconds);
        let cluster_queue = v.cluster_queue().unwrap_or_default();
        let Some((budget_name, class_name)) = pricing.queues.get(cluster_queue) else {
            if pricing.ready {
                let note = format!(
                    "ClusterQueue {cluster_queue:?} is not one kaccel generated for a CreditBudget: no budget pays for it"
                );
                self.set_check(v, "Pending", &note, None).await?;
            }
            return Ok(Some(retry_at));
        };
        let Some(budget) = pricing.budgets.get(budget_name) else {
            return Ok(Some(retry_at));
        };
        if let Some(message) = pricing.rate_problem(class_name) {
            return self.reject(v, &message).await;
        }
        if let Some((pod_set, vendor)) = asks_by_two_names(v) {
            let message = format!(
                "podSet {pod_set:?} asks for devices as both {} and {vendor}: Kueue cannot count one pod's devices under both names once; ask for all of them as {} (any vendor the class admits) or all as {vendor}",
                crate::api::CLASS_RESOURCE,
                crate::api::CLASS_RESOURCE
            );
            return self.reject(v, &message).await;
        }
        if let Some(misplaced) = self.misplaced_claim(v).await? {
            let message = format!(
                "podSet {:?} claims devices of DeviceClass {} (ResourceClaimTemplate {}), which only flavor {} has, but Kueue placed it on flavor {}: Kueue counts claims of every kaccel DeviceClass as {} and takes the class's first flavor with room. Ask for {} instead (any flavor the class admits), or pin the podSet to its flavor with the nodeSelector of ResourceFlavor {} (its spec.nodeLabels), so Kueue places it there",
                misplaced.pod_set,
                misplaced.device_class,
                misplaced.template,
                misplaced.claim_flavor,
                misplaced.assigned_flavor,
                crate::api::CLASS_RESOURCE,
                crate::api::CLASS_RESOURCE,
                misplaced.claim_flavor
            );
            return self.reject(v, &message).await;
        }
        let pod_sets = pod_set_usage(v).map_err(|source| LedgerError::Admission {
            workload: shown.to_string(),
            source,
        })?;
        if let Some(allowed) = pricing.devices_per_pod.get(class_name)
            && let Some((pod_set, asked)) = disallowed_devices_per_pod(&pod_sets, allowed)
        {
            let message = format!(
                "AcceleratorClass {class_name} allows {} device(s) per pod (spec.devicesPerPod); podSet {pod_set:?} asks for {asked} per pod: ask for one of those counts, or use a queue of a class that allows {asked}",
                describe_counts(allowed)
            );
            return self.reject(v, &message).await;
        }
        let mut usage = total_usage(&pod_sets);
        // Kueue counts a DRA-only flavor's devices as the class resource; the
        // ledger's line names the DeviceClass they come from.
        for u in &mut usage {
            if u.resource == crate::api::CLASS_RESOURCE && pricing.dra_flavors.contains(&u.flavor) {
                u.resource = crate::plan::kueue_counting::dra_line_resource(&u.flavor);
            }
        }
        // A flavor the last plan did not know yet (just created): look again soon.
        if usage
            .iter()
            .any(|u| !pricing.flavor_models.contains_key(&u.flavor))
        {
            return Ok(Some(now + 2));
        }
        let default_horizon = budget
            .admission
            .default_horizon_seconds
            .unwrap_or(self.config.default_horizon_seconds);
        let horizon = horizon_seconds(v, default_horizon);
        let rates = |u: &FlavorUsage| {
            let model = pricing.flavor_models.get(&u.flavor)?;
            // Rates that do not parse were rejected by rate_problem above.
            let rates = pricing.classes.get(class_name)?.as_ref().ok()?;
            Some(rate_info(class_name, rates, model))
        };
        // Too large to price (overflow) is a property of the admission: retrying
        // cannot help, so the Workload is rejected with the reason.
        let priced = match reservation(&usage, &rates, horizon) {
            Ok(priced) => priced,
            Err(e) => {
                let message = format!(
                    "cannot price this admission: {e}; ask for fewer devices or a shorter spec.maximumExecutionTimeSeconds"
                );
                return self.reject(v, &message).await;
            }
        };
        let admitted_at = match condition(v, "QuotaReserved") {
            Some((true, Some(t), _)) => t,
            _ => now,
        };
        let (namespace, name) = namespace_and_name(v);
        let workload = WorkloadView {
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
            admission,
            admitted_at,
            now,
            cluster: v.cluster_name().to_string(),
        };
        let stage = |name: &'static str, since: std::time::Instant| {
            self.metrics
                .check_stage
                .get_or_create(&StageLabel { stage: name })
                .observe(since.elapsed().as_secs_f64());
        };
        // Unpriced usage is rejected below, whatever the balance: no record.
        let record = (!priced.lines.is_empty() && priced.unpriced.is_empty()).then(|| {
            ReservationRecord::from_lines(
                admission,
                budget_name,
                &budget.team,
                cluster_queue,
                admitted_at,
                horizon,
                &priced.lines,
            )
        });
        // The finalizer before the Reserve entry (once the entry exists, the
        // Workload cannot go away unsettled), and before the lock: the lock
        // serialises the balance check and the append of every reservation, and
        // held across this API write it let a burst through at one admission
        // per write. Written whether it reserves or waits; a Workload that waits
        // keeps it and is not written again while its price stays. The
        // Workload webhook puts the finalizer on at creation: then this write
        // is skipped, the Reserve entry goes first and the record follows once
        // Kueue has admitted the Workload (rebuilt from the entry, step 3 of the
        // reconcile), one API write fewer before the check is Ready. A record
        // already on the Workload that differs (an earlier price, or an earlier
        // admission) is rewritten first all the same: read back, it would
        // charge the wrong lines.
        if let Some(record) = &record
            && needs_record_first(v.has_finalizer(&self.config.finalizer), written, record)
        {
            let written = std::time::Instant::now();
            self.set_record(v, record).await?;
            stage("record", written);
        }
        let waited = std::time::Instant::now();
        let guard = self.reserve_lock.lock().await;
        stage("lock", waited);
        let read = std::time::Instant::now();
        let balances = self.balances_of(budget_name).await?;
        stage("balances", read);
        let view = BudgetView {
            budget: budget_name.clone(),
            team: budget.team.clone(),
            balances,
        };
        match decide(&view, &workload, &priced) {
            Decision::Reserve { entries } => {
                if !entries.is_empty() {
                    let appended = std::time::Instant::now();
                    self.append(&entries).await?;
                    stage("append", appended);
                }
                drop(guard);
                let note = match &record {
                    Some(record) => ready_note(
                        record,
                        &record.charge(&workload.namespace, &workload.name, uid),
                        v,
                    ),
                    None => "no accelerator devices to charge".to_string(),
                };
                let placed = self.placement(v, &usage, pricing);
                let note = with_placed(note, placed.as_deref());
                let answered = std::time::Instant::now();
                self.set_check(v, "Ready", &note, None).await?;
                stage("status", answered);
                if v.check(&self.config.admission_check_name).is_none() {
                    self.metrics.check_answered_unlisted.inc();
                }
                self.note_answered(uid, admission);
                if let Some(placed) = &placed {
                    self.owner_event(v, "Placed", placed).await;
                }
                self.count_decision("reserve");
                let latency = (k8s_openapi::jiff::Timestamp::now().as_millisecond() as f64
                    / 1000.0
                    - admitted_at as f64)
                    .max(0.0);
                self.metrics.check_latency.observe(latency);
                let _ = self.wake_planner.send(());
                Ok(None)
            }
            Decision::Wait { message } => {
                drop(guard);
                self.count_decision("wait");
                match budget.admission.when_short {
                    ShortPolicy::Retry => {
                        self.set_check(v, "Retry", &message, Some(self.config.retry_after_seconds))
                            .await?;
                        Ok(None)
                    }
                    ShortPolicy::Pending => {
                        if message != current_message {
                            self.set_check(v, "Pending", &message, None).await?;
                        }
                        Ok(Some(retry_at))
                    }
                }
            }
            Decision::Reject { message } => {
                drop(guard);
                self.reject(v, &message).await
            }
        }
    }

    /// The first podSet whose claim Kueue placed on a flavor its DeviceClass
    /// cannot give devices on (see [`misplaced_claim`]), reading the claims'
    /// ResourceClaimTemplates. A template that is gone is skipped (its pods
    /// cannot be created anyway).
    async fn misplaced_claim(
        &self,
        v: &Workload,
    ) -> Result<Option<crate::ledger::admission::MisplacedClaim>, LedgerError> {
        use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
        let templates: BTreeSet<&str> = v
            .spec
            .pod_sets
            .iter()
            .flat_map(|p| &p.claim_templates)
            .map(String::as_str)
            .collect();
        if templates.is_empty() {
            return Ok(None);
        }
        let (namespace, _) = namespace_and_name(v);
        let api: Api<ResourceClaimTemplate> = Api::namespaced(self.client.clone(), namespace);
        let mut device_classes = BTreeMap::new();
        for name in templates {
            let Some(template) = api.get_opt(name).await.map_err(|source| LedgerError::Api {
                action: format!("reading ResourceClaimTemplate {namespace}/{name}"),
                source,
            })?
            else {
                continue;
            };
            let requests = template
                .spec
                .spec
                .devices
                .iter()
                .flat_map(|d| d.requests.iter().flatten());
            let classes: Vec<String> = requests
                .flat_map(|r| {
                    r.exactly.iter().map(|e| e.device_class_name.clone()).chain(
                        r.first_available
                            .iter()
                            .flatten()
                            .map(|s| s.device_class_name.clone()),
                    )
                })
                .collect();
            device_classes.insert(name.to_string(), classes);
        }
        Ok(crate::ledger::admission::misplaced_claim(
            v,
            &device_classes,
        ))
    }

    /// A budget's balances from the cache, or the store when not cached. Callers
    /// hold `reserve_lock` when they decide on the figures.
    pub(super) async fn balances_of(&self, budget: &str) -> Result<Balances, LedgerError> {
        let cached = self
            .balances
            .lock()
            .expect("balances lock")
            .get(budget)
            .copied();
        if let Some(b) = cached {
            return Ok(b);
        }
        let b = self.store().balances(budget).await?;
        self.balances
            .lock()
            .expect("balances lock")
            .insert(budget.to_string(), b);
        Ok(b)
    }

    /// Reserves the next term of a running admission if its budget covers it (or
    /// allows the overdraft); else stops the Workload through Kueue.
    pub(super) async fn renew(
        &self,
        v: &Workload,
        charge: &Charge,
        state: &mut ChargeState,
        pricing: &PricingSnapshot,
        now: i64,
    ) -> Result<(), LedgerError> {
        let rule = pricing
            .budgets
            .get(&charge.owner.budget)
            .map(|b| {
                let limit = pricing
                    .budget_amounts
                    .get(&charge.owner.budget)
                    .and_then(|a| a.overdraft_limit);
                renewal_rule(&b.admission, limit)
            })
            .unwrap_or_default();
        let guard = self.reserve_lock.lock().await;
        let balances = self.balances_of(&charge.owner.budget).await?;
        match charge.decide_renewal(state.terms, &balances, rule, now) {
            Renewal::Renew { entries, overdraft } => {
                self.append(&entries).await?;
                drop(guard);
                state.apply(charge, &entries);
                self.count_decision(if overdraft {
                    "renew_overdraft"
                } else {
                    "renew"
                });
                if overdraft {
                    tracing::warn!(budget = %charge.owner.budget, workload = %charge.owner.workload, "reservation renewed into an overdraft");
                }
                let _ = self.wake_planner.send(());
            }
            Renewal::Stop { message } => {
                drop(guard);
                let drains = pricing
                    .budgets
                    .get(&charge.owner.budget)
                    .is_some_and(|b| b.on_exhaustion == ExhaustionPolicy::HoldAndDrain);
                if drains {
                    // HoldAndDrain: the Workload runs on, charged as used (overrun),
                    // until its spending uses up the grant and the queue drains
                    // (Kueue evicts and requeues it; a top-up brings it back).
                    self.count_decision("await_drain");
                    tracing::info!(workload = %charge.owner.workload, %message, "renewal not covered; HoldAndDrain will stop it when the grant is spent");
                } else {
                    self.count_decision("stop");
                    self.stop_workload(v, &message).await?;
                }
            }
        }
        Ok(())
    }

    /// Deactivates a Workload whose renewal the budget cannot cover (Kueue evicts
    /// it and stops counting it), with the reason in an annotation and an Event.
    pub(super) async fn stop_workload(
        &self,
        v: &Workload,
        message: &str,
    ) -> Result<(), LedgerError> {
        let (namespace, name) = namespace_and_name(v);
        let patch = json!({
            "metadata": {"annotations": {STOPPED_ANNOTATION: message}},
            "spec": {"active": false},
        });
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), namespace, &workload_resource());
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|source| LedgerError::Api {
                action: format!("stopping Workload {namespace}/{name} for want of credits"),
                source,
            })?;
        self.metrics.write("Workload", "stop");
        tracing::warn!(workload = %format!("{namespace}/{name}"), %message, "stopped a Workload its budget cannot cover");
        self.workload_event(v, "CreditsExhausted", "StopWorkload", message)
            .await;
        Ok(())
    }

    /// A Warning Event on the Workload: what its user reads with `kubectl
    /// describe` after Kueue has moved on (it resets a rejected check to Pending
    /// when it deactivates the Workload, and the check's message with it).
    async fn workload_event(&self, v: &Workload, reason: &str, action: &str, message: &str) {
        let reference = ObjectReference {
            api_version: Some(crate::k8s::resources::kueue_api_version()),
            kind: Some("Workload".into()),
            namespace: v.metadata.namespace.clone(),
            name: v.metadata.name.clone(),
            uid: v.metadata.uid.clone(),
            ..Default::default()
        };
        self.publish(&reference, EventType::Warning, reason, action, message)
            .await;
    }

    /// An Event about `reference`, its note cut to what the API server keeps.
    async fn publish(
        &self,
        reference: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        message: &str,
    ) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(message.chars().take(1000).collect()),
            action: action.into(),
            secondary: None,
        };
        crate::controller::publish_event(&self.recorder, &self.metrics, &event, reference).await;
    }

    /// Where Kueue placed the Workload (its device `usage`) and why
    /// ([`placement_note`]).
    fn placement(
        &self,
        v: &Workload,
        usage: &[FlavorUsage],
        pricing: &PricingSnapshot,
    ) -> Option<String> {
        let cluster_queue = v.cluster_queue().unwrap_or_default();
        let (_, class) = pricing.queues.get(cluster_queue)?;
        let queue = self
            .cluster_queues
            .get()
            .and_then(|cache| cache.get(None, cluster_queue))
            .map(|q| q.value());
        placement_note(class, usage, &pricing.flavor_models, queue.as_ref(), || {
            self.devices_held_in(cluster_queue, v)
        })
    }

    /// Whether the ClusterQueue `v` holds quota in is one of kaccel's, as its
    /// cache has it, and calls for kaccel's check on `v`'s admission.
    fn queue_calls_for_check(&self, v: &Workload) -> bool {
        let Some(name) = v.cluster_queue() else {
            return false;
        };
        self.cluster_queues
            .get()
            .and_then(|cache| cache.get(None, name))
            .is_some_and(|queue| {
                v.check_called_for(&queue.value(), &self.config.admission_check_name)
            })
    }

    /// Per flavor, the devices the other open Workloads of `cluster_queue` hold,
    /// as kaccel's own cache has them (each counted once, as the ledger does).
    fn devices_held_in(&self, cluster_queue: &str, except: &Workload) -> BTreeMap<String, u64> {
        let mut held: BTreeMap<String, u64> = BTreeMap::new();
        let Some((cache, open)) = self.open_work.get() else {
            return held;
        };
        for key in open.keys() {
            let Some(w) = cache.get(&key) else { continue };
            let holds = w.cluster_queue() == Some(cluster_queue)
                && w.is_true("QuotaReserved")
                && !w.is_true("Finished")
                && w.metadata.uid != except.metadata.uid;
            if !holds {
                continue;
            }
            for u in usage_from_workload(&w).unwrap_or_default() {
                *held.entry(u.flavor).or_default() += u.device_units;
            }
        }
        held
    }

    /// A Normal Event on the object the Workload was made for (its Job), where
    /// the user who submitted it looks: which flavor and model, and why.
    async fn owner_event(&self, v: &Workload, reason: &str, message: &str) {
        let Some(owner) = v.metadata.owner_references.iter().flatten().next() else {
            return;
        };
        let reference = ObjectReference {
            api_version: Some(owner.api_version.clone()),
            kind: Some(owner.kind.clone()),
            namespace: v.metadata.namespace.clone(),
            name: Some(owner.name.clone()),
            uid: Some(owner.uid.clone()),
            ..Default::default()
        };
        self.publish(&reference, EventType::Normal, reason, "Admit", message)
            .await;
    }

    pub(super) async fn reject(
        &self,
        v: &Workload,
        message: &str,
    ) -> Result<Option<i64>, LedgerError> {
        self.count_decision("reject");
        self.set_check(v, "Rejected", message, None).await?;
        self.workload_event(v, "CreditCheckRejected", "RejectAdmission", message)
            .await;
        Ok(None)
    }

    pub(super) fn count_decision(&self, decision: &str) {
        self.metrics
            .check_decisions
            .get_or_create(&DecisionLabel {
                decision: decision.into(),
            })
            .inc();
    }

    /// Writes kaccel's check state on the Workload (server-side apply of its own
    /// entry of the `admissionChecks` map list; other checks are untouched).
    pub(super) async fn set_check(
        &self,
        v: &Workload,
        state: &str,
        message: &str,
        requeue_after: Option<u32>,
    ) -> Result<(), LedgerError> {
        let (namespace, name) = namespace_and_name(v);
        let check = &self.config.admission_check_name;
        let current = check_state(v, check);
        if current == Some((state, message)) && state != "Retry" {
            return Ok(());
        }
        // The transition time moves only when the state does.
        let transition = match current {
            Some((s, _)) if s == state => v
                .check(check)
                .and_then(|c| c.last_transition_time.clone())
                .unwrap_or_else(|| rfc3339(now_seconds())),
            _ => rfc3339(now_seconds()),
        };
        let mut entry = json!({
            "name": check,
            "state": state,
            "message": message.chars().take(4000).collect::<String>(),
            "lastTransitionTime": transition,
        });
        if let Some(after) = requeue_after {
            entry["requeueAfterSeconds"] = json!(after);
        }
        let patch = json!({
            "apiVersion": crate::k8s::resources::kueue_api_version(),
            "kind": "Workload",
            "metadata": {"name": name, "namespace": namespace},
            "status": {"admissionChecks": [entry]},
        });
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), namespace, &workload_resource());
        api.patch_status(
            name,
            &PatchParams::apply(&self.field_manager).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(|source| LedgerError::Api {
            action: format!("setting the credit check {state} on Workload {namespace}/{name}"),
            source,
        })?;
        self.metrics.write("Workload", "check");
        Ok(())
    }

    /// Sets kaccel's finalizer and reservation record on a Workload, by
    /// server-side apply of just those two fields.
    pub(super) async fn set_record(
        &self,
        v: &Workload,
        record: &ReservationRecord,
    ) -> Result<(), LedgerError> {
        let (namespace, name) = namespace_and_name(v);
        let patch = json!({
            "apiVersion": crate::k8s::resources::kueue_api_version(),
            "kind": "Workload",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "finalizers": [self.config.finalizer],
                "annotations": {RESERVATION_ANNOTATION: record.to_annotation()},
            },
        });
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), namespace, &workload_resource());
        api.patch(
            name,
            &PatchParams::apply(&self.field_manager).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(|source| LedgerError::Api {
            action: format!("writing kaccel's finalizer on Workload {namespace}/{name}"),
            source,
        })?;
        self.metrics.write("Workload", "finalizer");
        Ok(())
    }

    /// Removes kaccel's finalizer and record from a settled Workload. A JSON patch
    /// of exactly those entries: releasing by server-side apply left the
    /// finalizer behind whenever another writer had re-sent the list meanwhile
    /// (Kueue drops its own finalizer with a patch of the whole list, which makes
    /// it a co-owner of ours).
    pub(super) async fn release(&self, v: &Workload) -> Result<(), LedgerError> {
        let (namespace, name) = namespace_and_name(v);
        let Some(patch) = release_patch(v, &self.config.finalizer) else {
            return Ok(());
        };
        let patch = serde_json::from_value(patch).expect("a valid JSON patch");
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), namespace, &workload_resource());
        match api
            .patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
            .await
        {
            Ok(_) => {}
            // Gone already (its finalizer was the last): nothing to remove.
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(source) => {
                return Err(LedgerError::Api {
                    action: format!("removing kaccel's finalizer from Workload {namespace}/{name}"),
                    source,
                });
            }
        }
        self.metrics.write("Workload", "finalizer");
        Ok(())
    }
}

/// What kaccel's check is asked on a Workload, if anything: the message of its
/// Pending check; or, on a Workload kaccel charges (`charged`: its finalizer)
/// that holds quota while Kueue has not listed the check yet, an empty
/// question when the queue calls for the check (`queue_calls_for_it`, asked
/// only then). A check in any other state is answered already.
pub(super) fn open_question<'a>(
    check: Option<(&str, &'a str)>,
    charged: bool,
    holds_quota: bool,
    queue_calls_for_it: impl FnOnce() -> bool,
) -> Option<&'a str> {
    match check {
        Some(("Pending", message)) => Some(message),
        None if charged && holds_quota && queue_calls_for_it() => Some(""),
        _ => None,
    }
}

/// Whether `record` must be written on the Workload before its Reserve entry:
/// when kaccel's finalizer is not on it yet, or when the record `written` on it
/// is another one. A Workload with the finalizer and no record (the Workload
/// webhook's) gets its record after Kueue admits it, rebuilt from the entry.
pub(super) fn needs_record_first(
    has_finalizer: bool,
    written: Option<&ReservationRecord>,
    record: &ReservationRecord,
) -> bool {
    !has_finalizer || written.is_some_and(|w| w != record)
}

/// The JSON patch that drops kaccel's finalizer and reservation record, as
/// read; none when the finalizer is gone. Each removal is guarded by a test of
/// exactly what it removes (the finalizer at that position, the record with the
/// value that was settled), not of the resourceVersion: Kueue writes the status
/// of a finishing Workload several times a second, and every one of those
/// writes failed a resourceVersion test. A real conflict (a finalizer list that
/// moved, a record written for a new admission) still fails the patch, and the
/// reconcile is retried on a fresh read.
pub(super) fn release_patch(v: &Workload, finalizer: &str) -> Option<Value> {
    let index = v
        .metadata
        .finalizers
        .as_ref()
        .and_then(|f| f.iter().position(|f| f == finalizer))?;
    let path = format!("/metadata/finalizers/{index}");
    let mut ops = vec![
        json!({"op": "test", "path": path, "value": finalizer}),
        json!({"op": "remove", "path": path}),
    ];
    if let Some(record) = v.annotation(RESERVATION_ANNOTATION) {
        ops.push(json!({"op": "test", "path": RESERVATION_ANNOTATION_POINTER, "value": record}));
        ops.push(json!({"op": "remove", "path": RESERVATION_ANNOTATION_POINTER}));
    }
    Some(Value::Array(ops))
}

pub(super) fn namespace_and_name(v: &Workload) -> (&str, &str) {
    let meta = &v.metadata;
    (
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
    )
}

/// The check's message once credits are reserved (the same words whichever path
/// sets it, so a replay writes nothing).
pub(super) fn ready_note(
    record: &ReservationRecord,
    charge: &Charge,
    workload: &Workload,
) -> String {
    let mut cards: Vec<&str> = record.lines.iter().map(|l| l.rate_card.as_str()).collect();
    cards.sort_unstable();
    cards.dedup();
    let span = if is_bounded(workload) {
        format!("for up to {}s", record.horizon_seconds)
    } else {
        format!(
            "for the first {}s, renewed every {}s while it runs",
            record.horizon_seconds, record.horizon_seconds
        )
    };
    format!(
        "reserved {} credits of budget {} {span} (rate card {})",
        format_micros(i128::try_from(charge.term_price(0)).unwrap_or(i128::MAX)),
        record.budget,
        cards.join(", ")
    )
}

/// `note`, then where the Workload was placed and why, when that is known.
fn with_placed(note: String, placed: Option<&str>) -> String {
    match placed {
        Some(placed) => format!("{note}; {placed}"),
        None => note,
    }
}

/// Where Kueue placed the admission and why, in the user's words:
/// `large-training: on amd-instinct-mi300x-oam (AMD_Instinct_MI300X_OAM); nvidia-h100-80gb-hbm3 full: 8/8 in use`.
/// The flavors tried first are those before it in the ClusterQueue's resource
/// group (the class's preference order); their use is Kueue's own
/// (`status.flavorsReservation`), each device counted once (see
/// `admission::pod_set_usage`). `None` when the admission uses no device.
pub(super) fn placement_note(
    class: &str,
    usage: &[FlavorUsage],
    models: &BTreeMap<String, String>,
    cluster_queue: Option<&Value>,
    held: impl FnOnce() -> BTreeMap<String, u64>,
) -> Option<String> {
    let flavor = &usage.first()?.flavor;
    let model = models
        .get(flavor)
        .map(|m| format!(" ({m})"))
        .unwrap_or_default();
    let mut note = format!("{class}: on {flavor}{model}");
    let Some(cq) = cluster_queue else {
        return Some(note);
    };
    let group = cq["spec"]["resourceGroups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|g| g["flavors"].as_array())
        .find(|flavors| flavors.iter().any(|f| f["name"] == flavor.as_str()));
    let earlier: Vec<&Value> = group
        .into_iter()
        .flatten()
        .take_while(|f| f["name"] != flavor.as_str())
        .collect();
    // What kaccel saw admitted in the queue, counted only when a flavor was
    // passed over (a scan of the open Workloads, kept off the common path).
    let held = if earlier.is_empty() {
        BTreeMap::new()
    } else {
        held()
    };
    let reasons: Vec<String> = earlier
        .iter()
        .map(|f| {
            let name = f["name"].as_str().unwrap_or_default();
            let nominal = flavor_devices(&f["resources"], "nominalQuota");
            let in_use = cq["status"]["flavorsReservation"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|r| r["name"] == name)
                .map(|r| flavor_devices(&r["resources"], "total"))
                .unwrap_or(0)
                // Kueue writes its count a moment after it admits: what kaccel
                // saw admitted is never less.
                .max(held.get(name).copied().unwrap_or(0));
            if in_use >= nominal {
                format!("{name} full: {in_use}/{nominal} in use")
            } else {
                // Kueue skipped it with room left in this queue: the cohort's
                // share, a borrowing limit, or a count not seen yet.
                format!("{name} had no room for it ({in_use}/{nominal} in use in this queue)")
            }
        })
        .collect();
    if reasons.is_empty() {
        note.push_str(", its first preference");
    } else {
        note.push_str("; ");
        note.push_str(&reasons.join(", "));
    }
    Some(note)
}

/// A Workload with `spec.maximumExecutionTimeSeconds`: Kueue stops it at its
/// horizon, so its reservation is never renewed (the eviction's lag is charged
/// as overrun).
pub(super) fn is_bounded(workload: &Workload) -> bool {
    workload.maximum_execution_seconds().is_some()
}

/// A budget's rule for renewals it cannot cover, with its overdraft limit as
/// parsed (none when unset or when the budget did not parse: no overdraft; the
/// budget's Invalid condition names the field).
pub(super) fn renewal_rule(
    policy: &crate::api::AdmissionPolicy,
    limit: Option<Credits>,
) -> RenewalRule {
    RenewalRule {
        allow_overdraft: policy.when_renewal_short == Some(RenewalShortPolicy::Overdraft)
            && limit.is_some(),
        overdraft_limit: limit.unwrap_or(Credits::ZERO),
    }
}

#[cfg(test)]
mod tests;
