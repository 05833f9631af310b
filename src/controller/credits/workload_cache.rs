//! What the credit check keeps of each Workload, and the index of the ones the
//! budget pass compares with the ledger.

use super::*;

/// Whether the credit check has anything to do with a Workload, so the cache
/// holds it and its changes are reconciled: charged (kaccel's finalizer), or
/// holding quota unfinished with kaccel's check on it.
///
/// Anything else is not held at all: a Workload waiting for quota, one without
/// kaccel's check, and finished history whose settlement is done (the finalizer
/// gone). The reconcile has nothing to do for those (it answered them "await a
/// change" when they were held) and the budget pass skips them; they are what a
/// cluster keeps by the ten thousand, and held as identities they were 18 MiB
/// at 20,000 (`e2e/bench-controller.sh scale`, heaptrack). A change brings the
/// whole object again with its watch event, so one that gets quota is held from
/// then on.
pub(super) fn worth_caching(w: &Workload, ours: &Ours) -> bool {
    w.has_finalizer(&ours.finalizer)
        || (w.has_check(&ours.check) && w.is_true("QuotaReserved") && !w.is_true("Finished"))
}

/// What the credit check keeps of a Workload it holds ([`worth_caching`]): the
/// typed view less what deserialising could not skip (managed fields, labels,
/// foreign annotations, CPU and memory usage). Of any other only its identity
/// is passed on, to the indexes that follow every Workload's events.
pub(super) fn slim_workload(w: &mut Workload, ours: &Ours) {
    if worth_caching(w, ours) {
        slim_view(w);
    } else {
        w.keep_identity_only();
    }
}

/// What marks a Workload as this installation's to charge: its AdmissionCheck
/// on the Workload, its finalizer on a charged one (both scoped by the
/// instance, so another installation's Workloads are never touched).
#[derive(Clone, Debug)]
pub(super) struct Ours {
    pub(super) check: String,
    pub(super) finalizer: String,
}

impl Ours {
    pub(super) fn of(config: &LedgerConfig) -> Ours {
        Ours {
            check: config.admission_check_name.clone(),
            finalizer: config.finalizer.clone(),
        }
    }
}

/// The keys of the Workloads the reconciliation against Kueue compares
/// ([`ledger_relevant`]), kept from the watch's events so a budget pass costs in
/// proportion to open work, not to every Workload the cluster keeps.
#[derive(Default)]
pub(super) struct RelevantWorkloads {
    state: std::sync::Mutex<RelevantState>,
}

#[derive(Default)]
pub(super) struct RelevantState {
    keys: std::collections::HashSet<ObjectRef<Workload>>,
    /// Filled during a (re-)list and swapped in when it is done, as the
    /// reflector does with its store: a Workload deleted while the watch was
    /// down is not in the new list.
    relisting: Option<std::collections::HashSet<ObjectRef<Workload>>>,
}

impl RelevantWorkloads {
    pub(super) fn observe(&self, event: &watcher::Event<Workload>, ours: &Ours) {
        let mut state = self.state.lock().expect("relevant index lock");
        match event {
            watcher::Event::Init => state.relisting = Some(Default::default()),
            watcher::Event::InitApply(w) => {
                if ledger_relevant(w, ours) {
                    let key = ObjectRef::from_obj(w);
                    state.relisting.get_or_insert_default().insert(key);
                }
            }
            watcher::Event::InitDone => {
                if let Some(keys) = state.relisting.take() {
                    state.keys = keys;
                }
            }
            watcher::Event::Apply(w) => {
                let key = ObjectRef::from_obj(w);
                if ledger_relevant(w, ours) {
                    state.keys.insert(key);
                } else {
                    state.keys.remove(&key);
                }
            }
            watcher::Event::Delete(w) => {
                state.keys.remove(&ObjectRef::from_obj(w));
            }
        }
        // A burst of open work leaves its buckets behind, as the cache's map does.
        if state.keys.capacity() > 1024 && state.keys.len() * 4 < state.keys.capacity() {
            state.keys.shrink_to_fit();
        }
    }

    pub(super) fn keys(&self) -> Vec<ObjectRef<Workload>> {
        let state = self.state.lock().expect("relevant index lock");
        state.keys.iter().cloned().collect()
    }
}

/// Feeds the watch's events into the Workload cache, and rebuilds the cache's
/// map once it holds a quarter or less of what it held at its peak.
///
/// kube-runtime's store is a hash map that never shrinks: after 100,000
/// Workloads are deleted it keeps their 131,072 buckets (about 14 MiB) until the
/// watch happens to re-list. The rebuild replays what the cache holds through
/// the writer as a local re-list (Init, one InitApply per object, InitDone), so
/// it costs in proportion to what is left, not to the peak, and takes no API
/// call. Never during a real re-list: that one builds its own map.
pub(super) struct CompactingWriter {
    writer: kube::runtime::reflector::store::Writer<Workload>,
    ours: Ours,
    reader: Cache<Workload>,
    /// The most objects held since the map was last built.
    peak: usize,
    relisting: bool,
    pub(super) compactions: u64,
}

/// Below this many objects at the peak, a rebuild is not worth its work.
const COMPACT_FROM_PEAK: usize = 4096;

impl CompactingWriter {
    pub(super) fn new(
        writer: kube::runtime::reflector::store::Writer<Workload>,
        ours: Ours,
    ) -> Self {
        let reader = writer.as_reader();
        CompactingWriter {
            writer,
            ours,
            reader,
            peak: 0,
            relisting: false,
            compactions: 0,
        }
    }

    pub(super) fn apply(&mut self, event: &watcher::Event<Workload>) {
        match event {
            // Not held: listed, it is left out; changed, it leaves the cache
            // (a charged Workload whose settlement is done).
            watcher::Event::InitApply(w) if !worth_caching(w, &self.ours) => {}
            watcher::Event::Apply(w) if !worth_caching(w, &self.ours) => {
                self.writer
                    .apply_watcher_event(&watcher::Event::Delete(w.clone()));
            }
            _ => self.writer.apply_watcher_event(event),
        }
        match event {
            watcher::Event::Init => self.relisting = true,
            watcher::Event::InitApply(_) => {}
            watcher::Event::InitDone => {
                self.relisting = false;
                // A fresh map, sized to what was listed.
                self.peak = self.reader.len();
            }
            watcher::Event::Apply(_) | watcher::Event::Delete(_) => {
                let held = self.reader.len();
                self.peak = self.peak.max(held);
                if !self.relisting && self.peak >= COMPACT_FROM_PEAK && held <= self.peak / 4 {
                    self.compact();
                }
            }
        }
    }

    fn compact(&mut self) {
        let held = self.reader.state();
        tracing::debug!(
            peak = self.peak,
            held = held.len(),
            "rebuilding the Workload cache's map"
        );
        self.writer.apply_watcher_event(&watcher::Event::Init);
        for object in &held {
            self.writer
                .apply_watcher_event(&watcher::Event::InitApply(Workload::clone(object)));
        }
        self.writer.apply_watcher_event(&watcher::Event::InitDone);
        self.peak = held.len();
        self.compactions += 1;
    }
}

/// The typed view of a Workload the check works on.
pub(super) fn slim_view(w: &mut Workload) {
    w.slim(
        "kaccel.io/",
        crate::ledger::admission::is_accelerator_resource,
    );
}

/// Whether the reconciliation against Kueue must look at a cached Workload:
/// charged (kaccel's finalizer), or counted by Kueue with kaccel's check on it.
pub(super) fn ledger_relevant(w: &Workload, ours: &Ours) -> bool {
    w.has_finalizer(&ours.finalizer) || (w.counted_by_kueue() && w.has_check(&ours.check))
}

/// Whether a Workload of the open work may be waiting for credits: its check
/// is not answered Ready (pending, retrying, or not listed yet). Only those are
/// looked at again when credits come back.
pub(super) fn may_wait_for_credits(w: &Workload, ours: &Ours) -> bool {
    w.check(&ours.check).is_none_or(|c| c.state != "Ready")
}

#[cfg(test)]
mod tests {
    use super::*;

    const FINALIZER: &str = "kaccel.io/credits";

    fn ours() -> Ours {
        Ours {
            check: "kaccel-credits".into(),
            finalizer: FINALIZER.into(),
        }
    }

    fn workload(conditions: Value, checks: Value, finalizers: Value) -> Workload {
        let mut w: Workload = serde_json::from_value(json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {
                "name": "w", "namespace": "ns", "uid": "u", "finalizers": finalizers,
                "annotations": {"kaccel.io/credit-reservation": "{}", "kubectl.kubernetes.io/last-applied-configuration": "{...}"},
                "managedFields": [{"manager": "kueue", "operation": "Update"}],
            },
            "spec": {"queueName": "q", "active": true, "podSets": [{"name": "main", "count": 1, "template": {"spec": {"containers": []}}}]},
            "status": {"conditions": conditions, "admissionChecks": checks, "resourceRequests": [{"name": "main"}]},
        }))
        .expect("a Workload");
        slim_workload(&mut w, &ours());
        w
    }

    /// An empty cache and the writer that feeds it, for kaccel's check.
    fn cache_under_test() -> (Cache<Workload>, CompactingWriter) {
        let writer = kube::runtime::reflector::store::Writer::<Workload>::default();
        let reader = writer.as_reader();
        (reader, CompactingWriter::new(writer, ours()))
    }

    fn cached_names(reader: &Cache<Workload>) -> Vec<String> {
        let mut n: Vec<String> = reader.state().iter().map(|w| w.name_any()).collect();
        n.sort();
        n
    }

    #[test]
    fn relevant_index_follows_the_watch() {
        let check = json!([{"name": "kaccel-credits", "state": "Ready"}]);
        let held = json!([{"type": "QuotaReserved", "status": "True", "lastTransitionTime": "2026-12-01T00:00:00Z"}]);
        let finished = json!([{"type": "Finished", "status": "True", "lastTransitionTime": "2026-12-01T00:10:00Z"}]);
        let named = |mut w: Workload, name: &str| {
            w.metadata.name = Some(name.into());
            w
        };
        let charged = named(
            workload(held.clone(), check.clone(), json!([FINALIZER])),
            "charged",
        );
        let settled = named(workload(finished, check.clone(), json!([])), "charged");
        let waiting = named(workload(held, check.clone(), json!([])), "waiting");
        let history = named(workload(json!([]), json!([]), json!([])), "history");
        let index = RelevantWorkloads::default();
        let names = |index: &RelevantWorkloads| {
            let mut n: Vec<String> = index.keys().into_iter().map(|k| k.name).collect();
            n.sort();
            n
        };
        index.observe(&watcher::Event::Init, &ours());
        for w in [&charged, &waiting, &history] {
            index.observe(&watcher::Event::InitApply(w.clone()), &ours());
        }
        // Nothing is swapped in before the list is complete.
        assert!(index.keys().is_empty());
        index.observe(&watcher::Event::InitDone, &ours());
        assert_eq!(names(&index), ["charged", "waiting"]);
        // Settled (finalizer released): out; deleted: out.
        index.observe(&watcher::Event::Apply(settled), &ours());
        index.observe(&watcher::Event::Delete(waiting.clone()), &ours());
        assert!(index.keys().is_empty());
        index.observe(&watcher::Event::Apply(waiting.clone()), &ours());
        assert_eq!(names(&index), ["waiting"]);
        // A re-list after the watch was down forgets what is gone.
        index.observe(&watcher::Event::Init, &ours());
        index.observe(&watcher::Event::InitApply(charged.clone()), &ours());
        index.observe(&watcher::Event::InitDone, &ours());
        assert_eq!(names(&index), ["charged"]);
    }

    #[test]
    fn only_workloads_not_answered_ready_may_wait_for_credits() {
        let held = json!([{"type": "QuotaReserved", "status": "True", "lastTransitionTime": "2026-12-01T00:00:00Z"}]);
        let with = |state: &str| {
            workload(
                held.clone(),
                json!([{"name": "kaccel-credits", "state": state, "message": ""}]),
                json!([FINALIZER]),
            )
        };
        assert!(!may_wait_for_credits(&with("Ready"), &ours()));
        for state in ["Pending", "Retry"] {
            assert!(may_wait_for_credits(&with(state), &ours()), "{state}");
        }
        let unlisted = workload(held.clone(), json!([]), json!([FINALIZER]));
        assert!(may_wait_for_credits(&unlisted, &ours()));
        // Another check's Ready says nothing about kaccel's.
        let other = workload(
            held,
            json!([{"name": "other", "state": "Ready", "message": ""}]),
            json!([FINALIZER]),
        );
        assert!(may_wait_for_credits(&other, &ours()));
    }

    #[test]
    fn the_cache_map_is_rebuilt_once_it_holds_a_quarter_of_its_peak() {
        let named = |i: usize| {
            let mut w = workload(json!([]), json!([]), json!([FINALIZER]));
            w.metadata.name = Some(format!("w-{i:05}"));
            w.metadata.uid = Some(format!("u-{i}"));
            w
        };
        let (reader, mut cache) = cache_under_test();
        cache.apply(&watcher::Event::Init);
        cache.apply(&watcher::Event::InitDone);
        for i in 0..5000 {
            cache.apply(&watcher::Event::Apply(named(i)));
        }
        // Down to 1,251 of a peak of 5,000: kept as it is.
        for i in 0..3749 {
            cache.apply(&watcher::Event::Delete(named(i)));
        }
        assert_eq!((cache.compactions, reader.len()), (0, 1251));
        // 1,250: rebuilt, holding exactly what was left, each object unchanged.
        cache.apply(&watcher::Event::Delete(named(3749)));
        assert_eq!((cache.compactions, reader.len()), (1, 1250));
        let left: Vec<String> = (3750..5000).map(|i| format!("w-{i:05}")).collect();
        assert_eq!(cached_names(&reader), left);
        assert_eq!(
            *reader.get(&ObjectRef::from_obj(&named(4000))).unwrap(),
            named(4000)
        );
        // The new peak is what was left: no rebuild on every later deletion.
        for i in 3750..4000 {
            cache.apply(&watcher::Event::Delete(named(i)));
        }
        assert_eq!(cache.compactions, 1);
        // Never in the middle of a real re-list, and the re-list's result stands.
        for i in 5000..10000 {
            cache.apply(&watcher::Event::Apply(named(i)));
        }
        cache.apply(&watcher::Event::Init);
        cache.apply(&watcher::Event::InitApply(named(7)));
        cache.apply(&watcher::Event::Delete(named(4000)));
        for i in 5000..10000 {
            cache.apply(&watcher::Event::Delete(named(i)));
        }
        assert_eq!(cache.compactions, 1);
        cache.apply(&watcher::Event::InitDone);
        assert_eq!(cached_names(&reader), ["w-00007"]);
    }

    #[test]
    fn history_and_foreign_workloads_are_passed_on_as_identity_only() {
        let check = json!([{"name": "kaccel-credits", "state": "Ready"}]);
        let finished = json!([{"type": "Finished", "status": "True", "lastTransitionTime": "2026-12-01T00:10:00Z"}]);
        let identity = |w: &Workload| {
            w.spec == Default::default()
                && w.status == Default::default()
                && w.metadata.annotations.is_none()
                && w.metadata.finalizers.is_none()
                && w.metadata.uid.as_deref() == Some("u")
                && w.metadata.name.as_deref() == Some("w")
        };
        // Settled history: finished, kaccel's finalizer gone.
        assert!(identity(&workload(
            finished.clone(),
            check.clone(),
            json!([])
        )));
        // Not kaccel's: no check of kaccel's, no finalizer.
        assert!(identity(&workload(json!([]), json!([]), json!([]))));
        let foreign = json!([{"name": "another-check", "state": "Pending"}]);
        assert!(identity(&workload(json!([]), foreign, json!([]))));
        // Finished but not yet settled: kept whole.
        let unsettled = workload(finished, check.clone(), json!([FINALIZER]));
        assert!(!identity(&unsettled) && unsettled.is_true("Finished"));
        // Still waiting for quota: nothing for the check to do yet.
        assert!(identity(&workload(json!([]), check.clone(), json!([]))));
        // Holding quota with the check on it: kept whole.
        let reserved = json!([{"type": "QuotaReserved", "status": "True", "lastTransitionTime": "2026-12-01T00:00:00Z"}]);
        let waiting = workload(reserved, check, json!([]));
        assert_eq!(waiting.status.admission_checks.len(), 1);
        assert_eq!(waiting.spec.queue_name.as_deref(), Some("q"));
    }

    #[test]
    fn the_cache_holds_only_workloads_the_check_has_work_with() {
        let check = json!([{"name": "kaccel-credits", "state": "Pending"}]);
        let reserved = json!([{"type": "QuotaReserved", "status": "True", "lastTransitionTime": "2026-12-01T00:00:00Z"}]);
        let finished = json!([
            {"type": "QuotaReserved", "status": "True", "lastTransitionTime": "2026-12-01T00:00:00Z"},
            {"type": "Finished", "status": "True", "lastTransitionTime": "2026-12-01T00:10:00Z"}
        ]);
        let named = |name: &str, mut w: Workload| {
            w.metadata.name = Some(name.into());
            w.metadata.uid = Some(format!("uid-{name}"));
            w
        };
        let waiting = named("waiting", workload(json!([]), check.clone(), json!([])));
        let foreign = named("foreign", workload(reserved.clone(), json!([]), json!([])));
        let checking = named(
            "checking",
            workload(reserved.clone(), check.clone(), json!([])),
        );
        let charged = named(
            "charged",
            workload(reserved.clone(), check.clone(), json!([FINALIZER])),
        );
        let history = named(
            "history",
            workload(finished.clone(), check.clone(), json!([])),
        );
        let (reader, mut cache) = cache_under_test();
        cache.apply(&watcher::Event::Init);
        for w in [&waiting, &foreign, &checking, &charged, &history] {
            cache.apply(&watcher::Event::InitApply(w.clone()));
        }
        cache.apply(&watcher::Event::InitDone);
        assert_eq!(cached_names(&reader), ["charged", "checking"]);
        // The waiting one gets quota: held from then on.
        let admitted = named("waiting", workload(reserved, check.clone(), json!([])));
        cache.apply(&watcher::Event::Apply(admitted));
        assert_eq!(cached_names(&reader), ["charged", "checking", "waiting"]);
        // The charged one is settled (finalizer released): it leaves the cache.
        let settled = named("charged", workload(finished, check, json!([])));
        assert!(!worth_caching(&settled, &ours()));
        cache.apply(&watcher::Event::Apply(settled));
        assert_eq!(cached_names(&reader), ["checking", "waiting"]);
        // Another installation's check and finalizer are not kaccel's work.
        let theirs = Ours {
            check: "team-b-credits".into(),
            finalizer: "kaccel.io/credits-team-b".into(),
        };
        assert!(!worth_caching(&charged, &theirs));
    }

    /// The budget pass looks its Workloads up in the cache: every one it
    /// counts must be held, in any state of conditions, check and finalizer.
    #[test]
    fn every_workload_the_budget_pass_counts_is_held() {
        for bits in 0u8..64 {
            let on = |b: u8| bits & (1 << b) != 0;
            let condition = |type_: &str, b: u8| json!({"type": type_, "status": if on(b) { "True" } else { "False" }, "lastTransitionTime": "2026-12-01T00:00:00Z"});
            let conditions = json!([
                condition("QuotaReserved", 0),
                condition("Finished", 1),
                condition("Evicted", 2)
            ]);
            let checks = if on(3) {
                json!([{"name": "kaccel-credits", "state": "Ready"}])
            } else {
                json!([])
            };
            let finalizers = if on(4) { json!([FINALIZER]) } else { json!([]) };
            // As the watch delivers it, before any slimming.
            let w: Workload = serde_json::from_value(json!({
                "metadata": {"name": "w", "namespace": "ns", "uid": "u", "finalizers": finalizers},
                "spec": {"queueName": "q", "active": !on(5)},
                "status": {"conditions": conditions, "admissionChecks": checks},
            }))
            .expect("a Workload");
            assert!(
                !ledger_relevant(&w, &ours()) || worth_caching(&w, &ours()),
                "case {bits:06b}: counted by the budget pass but not held"
            );
        }
    }

    #[test]
    fn the_cache_keeps_only_what_the_check_reads() {
        let w = workload(json!([]), json!([]), json!([FINALIZER]));
        assert!(w.metadata.managed_fields.is_none());
        let annotations = w.metadata.annotations.as_ref().unwrap();
        assert_eq!(
            annotations.keys().collect::<Vec<_>>(),
            ["kaccel.io/credit-reservation"]
        );
        let v = w.to_value();
        assert!(v["spec"].get("podSets").is_none());
        assert_eq!(v["spec"]["queueName"], "q");
        assert!(v["status"].get("resourceRequests").is_none());
        assert_eq!(w.finalizers(), [FINALIZER]);
    }

    #[test]
    fn the_reconciliation_skips_finished_history() {
        let check = json!([{"name": "kaccel-credits", "state": "Ready"}]);
        let reserved = json!({"type": "QuotaReserved", "status": "True", "lastTransitionTime": "2026-12-01T00:00:00Z"});
        let finished = json!({"type": "Finished", "status": "True", "lastTransitionTime": "2026-12-01T00:10:00Z"});
        // Charged: the finalizer makes it relevant whatever its state.
        let charged = workload(
            json!([reserved, finished]),
            check.clone(),
            json!([FINALIZER]),
        );
        assert!(ledger_relevant(&charged, &ours()));
        // Waiting on the check while holding quota: counted.
        let waiting = workload(json!([reserved]), check.clone(), json!([]));
        assert!(ledger_relevant(&waiting, &ours()));
        assert!(!ledger_relevant(
            &waiting,
            &Ours {
                check: "another-check".into(),
                ..ours()
            }
        ));
        // Another installation's charged Workload (its own finalizer) is not ours.
        let theirs = Ours {
            check: "team-b-credits".into(),
            finalizer: "kaccel.io/credits-team-b".into(),
        };
        assert!(!ledger_relevant(&charged, &theirs));
        // Finished and settled: skipped.
        let history = workload(json!([reserved, finished]), check, json!([]));
        assert!(!ledger_relevant(&history, &ours()));
    }
}
