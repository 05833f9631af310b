//! The store test suite, run unchanged against every backend (tests/ledger.rs for
//! SQLite, tests/ledger_postgres.rs for PostgreSQL). Each function takes a fresh,
//! empty store and panics on a failed check.

/// Calls `$m!` with the name of every suite function, so each backend's test file
/// runs all of them (one list: a new suite test cannot be wired to one backend
/// only).
#[macro_export]
#[doc(hidden)]
macro_rules! ledger_conformance_suite {
    ($m:ident) => {
        $m!(
            schema_is_current,
            append_is_idempotent,
            conflicting_replay_is_refused_atomically,
            invalid_entries_are_refused,
            two_phase_balances,
            hourly_posts_equal_one_post,
            streams_by_period_and_team,
            paged_reads_return_every_field,
            verify_finds_problems,
            entries_for_workload_and_by_key,
            open_reservations_track_posts_and_voids,
            open_reservations_fold_terms_per_line,
            posted_between_is_half_open_per_budget,
            devices_are_kept_and_not_part_of_identity,
            worker_cluster_is_kept_and_not_part_of_identity,
        );
    };
}

use super::entry::{
    Entry, EntryKind, LineRef, correction_key, grant_key, post_key, reserve_key, void_key,
};
use super::pricing::{Rate, price_interval};
use super::store::{
    EntryFilter, LedgerStore, OpenReservation, PAGE, StoreError, StoredEntry, for_each_entry,
    verify,
};

/// A grant, a reservation of 10 h of `units` devices at 4 credits/h, hourly posts
/// for `hours` hours and the void of the rest, for one workload admission.
pub fn lifecycle(budget: &str, team: &str, uid: &str, units: u64, hours: i64) -> Vec<Entry> {
    let t0 = 1_767_225_600;
    let base = Entry {
        key: String::new(),
        kind: EntryKind::Reserve,
        budget: budget.into(),
        team: team.into(),
        namespace: format!("ns-{team}"),
        workload: format!("job-{uid}"),
        workload_uid: uid.into(),
        admission: 1,
        class: "gpu-large".into(),
        flavor: "nvidia-h100".into(),
        resource: "nvidia.com/gpu".into(),
        device_units: units,
        start: t0,
        end: t0 + 36_000,
        credits: 0,
        rate_card: "rc-test".into(),
        reason: String::new(),
        created_at: t0,
        rate: 4_000_000,
        devices: vec![],
        cluster: String::new(),
    };
    let mut out = vec![grant_like(&base, 1_000_000_000)];
    out.extend(admission(&base, Rate(4_000_000), hours));
    out
}

/// The Grant of `credits` to `base`'s budget for the 30 days from `base.start`
/// (its workload fields blanked).
pub fn grant_like(base: &Entry, credits: i64) -> Entry {
    Entry {
        key: grant_key(&base.budget, base.start),
        kind: EntryKind::Grant,
        workload_uid: String::new(),
        namespace: String::new(),
        workload: String::new(),
        class: String::new(),
        flavor: String::new(),
        resource: String::new(),
        device_units: 0,
        credits,
        end: base.start + 30 * 86_400,
        ..base.clone()
    }
}

/// One admission of `base` (its budget, workload, device units and the horizon
/// `[start, end)`) at `rate`: the Reserve of the horizon, hourly Posts for
/// `posted_hours` and the Void of the rest.
pub fn admission(base: &Entry, rate: Rate, posted_hours: i64) -> Vec<Entry> {
    let start = base.start;
    let line = base.line();
    let price = |a, b| {
        price_interval(rate, base.device_units, start, a, b)
            .unwrap()
            .0 as i64
    };
    let reserved = price(start, base.end);
    let mut out = vec![Entry {
        key: reserve_key(&line, start),
        kind: EntryKind::Reserve,
        credits: reserved,
        ..base.clone()
    }];
    let mut posted = 0;
    for h in 0..posted_hours {
        let (a, b) = (start + h * 3600, start + (h + 1) * 3600);
        posted += price(a, b);
        out.push(Entry {
            key: post_key(&line, a, b),
            kind: EntryKind::Post,
            start: a,
            end: b,
            credits: price(a, b),
            created_at: b,
            ..base.clone()
        });
    }
    let ended = start + posted_hours * 3600;
    out.push(Entry {
        key: void_key(&line),
        kind: EntryKind::Void,
        credits: reserved - posted,
        end: ended,
        created_at: ended,
        ..base.clone()
    });
    out
}

/// The ledger a version-4 store held before its upgrade (see
/// [`upgraded_ledger_keeps_everything`]): two budgets, one admission settled,
/// one still open, written in this order so their ids are 1..=n.
pub fn version_4_ledger() -> Vec<Entry> {
    let mut entries = lifecycle("b1", "t", "u1", 2, 3);
    let mut open = lifecycle("b2", "t", "u2", 1, 1);
    open.pop();
    entries.extend(open);
    entries
}

/// After a store written by an older schema (holding [`version_4_ledger`] as
/// ids 1..=n) was opened by this build: every row kept with its id, a replay
/// is a duplicate, a changed replay is refused, new entries take the next ids,
/// and the admission queries and verify read the old rows.
pub async fn upgraded_ledger_keeps_everything<S: LedgerStore>(s: &S) {
    let before = version_4_ledger();
    schema_is_current(s).await;
    let mut all = Vec::new();
    for_each_entry(s, &EntryFilter::default(), |e: &StoredEntry| {
        all.push((e.id, e.entry.clone()));
        Ok::<_, StoreError>(())
    })
    .await
    .unwrap();
    let expected: Vec<(i64, Entry)> = (1..).zip(before.iter().cloned()).collect();
    assert_eq!(all, expected);
    let again = s.append(&before).await.unwrap();
    assert_eq!((again.inserted, again.duplicates), (0, before.len()));
    let mut changed = before[1].clone();
    changed.credits += 1;
    assert!(matches!(
        s.append(&[changed]).await,
        Err(StoreError::KeyConflict { .. })
    ));
    let by_workload: Vec<i64> = s
        .entries_for_workload("u1")
        .await
        .unwrap()
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(by_workload, (2..=6).collect::<Vec<i64>>());
    assert_eq!(
        s.entry_by_key(&before[1].key).await.unwrap().map(|e| e.id),
        Some(2)
    );
    let open = s.open_reservations().await.unwrap();
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].reserve.entry.workload_uid, "u2");
    assert!(verify(s).await.unwrap().ok());
    // New entries come after every old one (a replay may have used up ids:
    // both backends take an id before they find the conflict).
    let next = lifecycle("b3", "t", "u3", 1, 0);
    s.append(&next).await.unwrap();
    let n = before.len() as i64;
    let grant = s.entry_by_key(&next[0].key).await.unwrap().unwrap().id;
    let reserve = s.entry_by_key(&next[1].key).await.unwrap().unwrap().id;
    assert!(n < grant && grant < reserve, "{n} < {grant} < {reserve}");
}

pub async fn schema_is_current<S: LedgerStore>(s: &S) {
    assert_eq!(
        s.schema_version().await.unwrap(),
        super::store::SCHEMA_VERSION
    );
}

pub async fn append_is_idempotent<S: LedgerStore>(s: &S) {
    let entries = lifecycle("b1", "vision", "u1", 2, 3);
    let first = s.append(&entries).await.unwrap();
    assert_eq!(first.inserted, entries.len());
    assert_eq!(first.duplicates, 0);
    let before = s.balances("b1").await.unwrap();
    // A replay, written later (different created_at), inserts nothing.
    let mut replay = entries.clone();
    for e in &mut replay {
        e.created_at += 999;
    }
    let again = s.append(&replay).await.unwrap();
    assert_eq!(again.inserted, 0);
    assert_eq!(again.duplicates, entries.len());
    assert_eq!(s.balances("b1").await.unwrap(), before);
    // Duplicates inside one batch count once.
    let e = lifecycle("b2", "vision", "u2", 1, 1);
    let out = s.append(&[e[0].clone(), e[0].clone()]).await.unwrap();
    assert_eq!((out.inserted, out.duplicates), (1, 1));
}

/// The MultiKueue worker an admission ran in comes back as written on the
/// entries after the dispatch (the first Reserve precedes it); a replay that
/// names the worker where the first write did not is the same entry; a name
/// that is no DNS label is refused.
pub async fn worker_cluster_is_kept_and_not_part_of_identity<S: LedgerStore>(s: &S) {
    let mut entries = lifecycle("b1", "vision", "u1", 2, 3);
    let first_reserve = entries
        .iter()
        .position(|e| e.kind == EntryKind::Reserve)
        .expect("a reserve");
    for e in entries.iter_mut().skip(first_reserve + 1) {
        if e.workload_uid == "u1" {
            e.cluster = "worker-eu-1".into();
        }
    }
    s.append(&entries).await.unwrap();
    let stored = s.entries_for_workload("u1").await.unwrap();
    assert_eq!(
        stored.len(),
        entries.iter().filter(|e| e.workload_uid == "u1").count()
    );
    for (s, written) in stored
        .iter()
        .zip(entries.iter().filter(|e| e.workload_uid == "u1"))
    {
        assert_eq!(s.entry.cluster, written.cluster, "{}", s.entry.key);
    }
    assert!(stored.iter().any(|e| e.entry.cluster == "worker-eu-1"));
    assert!(stored.iter().any(|e| e.entry.cluster.is_empty()));
    let mut replay = entries.clone();
    for e in &mut replay {
        e.cluster = "worker-eu-1".into();
    }
    let again = s.append(&replay).await.unwrap();
    assert_eq!((again.inserted, again.duplicates), (0, entries.len()));
    let mut bad = lifecycle("b2", "vision", "u2", 1, 1);
    bad[1].cluster = "Worker_1".into();
    let err = s.append(&bad).await.unwrap_err().to_string();
    assert!(err.contains("DNS label"), "{err}");
}

/// The devices an entry's admission held come back as written; a replay that saw
/// other devices (or none) is the same entry, and ids with a separator are refused.
pub async fn devices_are_kept_and_not_part_of_identity<S: LedgerStore>(s: &S) {
    let mut entries = lifecycle("b1", "vision", "u1", 2, 3);
    let held = vec!["GPU-5f3a8c2e".to_string(), "GPU-9c41d7b0".to_string()];
    for e in entries.iter_mut().filter(|e| e.kind == EntryKind::Post) {
        e.devices.clone_from(&held);
    }
    s.append(&entries).await.unwrap();
    let stored = s.entries_for_workload("u1").await.unwrap();
    let posts: Vec<&StoredEntry> = stored
        .iter()
        .filter(|e| e.entry.kind == EntryKind::Post)
        .collect();
    assert!(!posts.is_empty());
    for p in &posts {
        assert_eq!(p.entry.devices, held, "{}", p.entry.key);
    }
    assert!(
        stored
            .iter()
            .filter(|e| e.entry.kind != EntryKind::Post)
            .all(|e| e.entry.devices.is_empty())
    );
    // Which entries ran on a card: the filter by device.
    let on_card = EntryFilter {
        device: Some("GPU-9c41d7b0".into()),
        ..EntryFilter::default()
    };
    let mut kinds = Vec::new();
    for_each_entry(s, &on_card, |e| {
        kinds.push(e.entry.kind);
        Ok::<(), StoreError>(())
    })
    .await
    .unwrap();
    assert_eq!(kinds.len(), posts.len());
    assert!(kinds.iter().all(|k| *k == EntryKind::Post));
    let mut replay = entries.clone();
    for e in &mut replay {
        e.devices = vec!["GPU-other".into()];
    }
    let again = s.append(&replay).await.unwrap();
    assert_eq!((again.inserted, again.duplicates), (0, entries.len()));
    let mut bad = lifecycle("b2", "vision", "u2", 1, 1);
    bad[0].devices = vec!["GPU-a,GPU-b".into()];
    let err = s.append(&bad).await.unwrap_err().to_string();
    assert!(err.contains("without commas"), "{err}");
}

pub async fn conflicting_replay_is_refused_atomically<S: LedgerStore>(s: &S) {
    let entries = lifecycle("b1", "vision", "u1", 2, 2);
    s.append(&entries).await.unwrap();
    let fresh = lifecycle("b9", "nlp", "u9", 1, 1);
    let mut changed = entries[2].clone();
    changed.credits += 1;
    let err = s
        .append(&[fresh[0].clone(), changed.clone()])
        .await
        .unwrap_err();
    match &err {
        StoreError::KeyConflict { key, .. } => assert_eq!(key, &changed.key),
        other => panic!("expected a key conflict, got {other}"),
    }
    assert!(err.to_string().contains(&changed.key), "{err}");
    // Nothing of the failed batch was written.
    assert_eq!(
        s.balances("b9").await.unwrap(),
        Default::default(),
        "a failed batch left entries behind"
    );
}

pub async fn invalid_entries_are_refused<S: LedgerStore>(s: &S) {
    let mut e = lifecycle("b1", "vision", "u1", 1, 1);
    e[2].credits = -5;
    let err = s.append(&e).await.unwrap_err();
    assert!(matches!(err, StoreError::InvalidEntry { .. }), "{err}");
    let mut e = lifecycle("b1", "vision", "u1", 1, 1);
    e[2].key = "post/b1/u1/1/whatever".into();
    assert!(matches!(
        s.append(&e).await.unwrap_err(),
        StoreError::InvalidEntry { .. }
    ));
    assert_eq!(s.balances("b1").await.unwrap(), Default::default());
}

pub async fn two_phase_balances<S: LedgerStore>(s: &S) {
    // 4 devices, 10 h reserved at 4 credits/h = 160; 3 h posted = 48; rest voided.
    let mut entries = lifecycle("b1", "vision", "u1", 4, 3);
    let void = entries.pop().unwrap();
    s.append(&entries).await.unwrap();
    let open = s.balances("b1").await.unwrap();
    assert_eq!(open.granted, 1_000_000_000);
    assert_eq!(open.spent, 48_000_000);
    assert_eq!(open.reserved, 112_000_000);
    assert_eq!(open.remaining(), 1_000_000_000 - 160_000_000);
    let report = verify(s).await.unwrap();
    assert!(report.ok(), "{:?}", report.problems);
    assert_eq!(report.open_reservations, 1);
    s.append(&[void]).await.unwrap();
    // A preemption refund of one hour.
    let refund = Entry {
        key: correction_key("b1", "u1", 1, 1_767_225_600, 1_767_229_200, "refund"),
        kind: EntryKind::Correction,
        credits: -16_000_000,
        reason: "refund".into(),
        ..entries[2].clone()
    };
    s.append(&[refund]).await.unwrap();
    let closed = s.balances("b1").await.unwrap();
    assert_eq!(closed.reserved, 0);
    assert_eq!(closed.spent, 32_000_000);
    assert_eq!(closed.remaining(), 1_000_000_000 - 32_000_000);
    let report = verify(s).await.unwrap();
    assert!(report.ok(), "{:?}", report.problems);
    assert_eq!(report.open_reservations, 0);
    assert_eq!(report.budgets["b1"], closed);
}

pub async fn hourly_posts_equal_one_post<S: LedgerStore>(s: &S) {
    // Odd rate and units so that per-hour flooring would drift if it could.
    let rate = Rate(1_234_567);
    let (t0, units) = (1_000_003, 7);
    let mut hourly = Vec::new();
    let mut t = t0;
    while t < t0 + 10 * 3600 + 17 {
        let b = (t + 3600).min(t0 + 10 * 3600 + 17);
        let mut e = lifecycle("hourly", "x", "u", units, 0)[1].clone();
        e.kind = EntryKind::Post;
        e.kind = EntryKind::Post;
        e.start = t;
        e.end = b;
        e.key = e.derived_key().unwrap();
        e.credits = price_interval(rate, units, t0, t, b).unwrap().0 as i64;
        hourly.push(e);
        t = b;
    }
    s.append(&hourly).await.unwrap();
    let whole = price_interval(rate, units, t0, t0, t0 + 10 * 3600 + 17).unwrap();
    assert_eq!(
        s.balances("hourly").await.unwrap().spent,
        i128::from(whole.0)
    );
}

pub async fn streams_by_period_and_team<S: LedgerStore>(s: &S) {
    // More than one page, two teams.
    let mut all = Vec::new();
    for w in 0..(PAGE / 5 + 50) {
        let team = if w.is_multiple_of(2) { "vision" } else { "nlp" };
        let mut l = lifecycle(&format!("b-{team}"), team, &format!("u{w}"), 1, 3);
        if w > 0 {
            l.remove(0); // one grant per budget: vision's here, nlp's below
        }
        all.extend(l);
    }
    all.push(lifecycle("b-nlp", "nlp", "x", 1, 0)[0].clone());
    for chunk in all.chunks(700) {
        s.append(chunk).await.unwrap();
    }
    // Two replays of everything (PostgreSQL spends an id on each conflicting
    // insert: a gap of more than two pages, so a whole page of ids holds
    // none), then entries after the gap.
    for _ in 0..2 {
        for chunk in all.chunks(700) {
            assert_eq!(s.append(chunk).await.unwrap().duplicates, chunk.len());
        }
    }
    let after_gap = lifecycle("b-vision", "vision", "after-gap", 1, 3);
    s.append(&after_gap[1..]).await.unwrap();
    all.extend_from_slice(&after_gap[1..]);
    let mut n = 0u64;
    let mut last = 0;
    let total = for_each_entry(s, &EntryFilter::default(), |e| {
        assert!(e.id > last, "ids not increasing");
        last = e.id;
        n += 1;
        Ok::<_, StoreError>(())
    })
    .await
    .unwrap();
    assert_eq!(total, all.len() as u64);
    assert_eq!(n, total);
    assert!(total > PAGE as u64);
    // The second hour only (posts starting at t0 + 1 h), one team.
    let t0 = 1_767_225_600;
    let filter = EntryFilter {
        from: Some(t0 + 3600),
        to: Some(t0 + 7200),
        team: Some("vision".into()),
        device: None,
        kinds: None,
    };
    let mut seen = 0u64;
    for_each_entry(s, &filter, |e| {
        assert_eq!(e.entry.team, "vision");
        assert_eq!(e.entry.kind, EntryKind::Post);
        assert_eq!(e.entry.start, t0 + 3600);
        seen += 1;
        Ok::<_, StoreError>(())
    })
    .await
    .unwrap();
    let expected = all
        .iter()
        .filter(|e| e.team == "vision" && e.start == t0 + 3600)
        .count() as u64;
    assert_eq!(seen, expected);
    assert!(seen > 0);

    // By kind: the store reads only the kinds asked for (what a FOCUS export
    // asks for), every one of them, in id order; with a team too; none at all.
    for (kinds, team) in [
        (vec![EntryKind::Post], None),
        (vec![EntryKind::Reserve, EntryKind::Void], None),
        (vec![EntryKind::Post, EntryKind::Correction], Some("vision")),
        (vec![], None),
    ] {
        let filter = EntryFilter {
            team: team.map(String::from),
            kinds: Some(kinds.clone()),
            ..EntryFilter::default()
        };
        let mut streamed = Vec::new();
        let mut last = 0;
        for_each_entry(s, &filter, |e| {
            assert!(e.id > last, "ids not increasing");
            last = e.id;
            streamed.push(e.entry.key.clone());
            Ok::<_, StoreError>(())
        })
        .await
        .unwrap();
        streamed.sort();
        let mut expected: Vec<String> = all
            .iter()
            .filter(|e| kinds.contains(&e.kind) && team.is_none_or(|t| e.team == t))
            .map(|e| e.key.clone())
            .collect();
        expected.sort();
        assert_eq!(streamed, expected, "kinds {kinds:?}, team {team:?}");
        assert_eq!(expected.is_empty(), kinds.is_empty());
    }
}

/// Entries streamed back in pages are the entries appended, field for field.
/// A backend's page reader decodes each page over one the consumer handed
/// back: here long texts follow short ones and the other way round, device
/// lists grow and shrink, and there are more pages than a reader keeps spare,
/// so a field left over from an earlier page would show.
pub async fn paged_reads_return_every_field<S: LedgerStore>(s: &S) {
    let mut all = Vec::new();
    let mut w = 0usize;
    while all.len() < PAGE * 12 {
        let team = if w.is_multiple_of(2) {
            "t"
        } else {
            "a-team-with-a-much-longer-name"
        };
        let uid = format!("paged-{w}");
        let mut entries = lifecycle("b-paged", team, &uid, 1 + (w % 3) as u64, 2);
        if w > 0 {
            entries.remove(0); // one grant for the budget
        }
        for (i, e) in entries.iter_mut().enumerate() {
            e.devices = (0..(w + i) % 4)
                .map(|d| format!("GPU-{w}-{}", "x".repeat(d * 7)))
                .collect();
            if (w + i).is_multiple_of(3) {
                e.cluster = format!("w{}", "y".repeat(w % 17));
            }
        }
        all.extend(entries);
        w += 1;
    }
    for chunk in all.chunks(1000) {
        assert_eq!(s.append(chunk).await.unwrap().inserted, chunk.len());
    }
    let mut read = Vec::with_capacity(all.len());
    let mut last = 0;
    for_each_entry(s, &EntryFilter::default(), |e: &StoredEntry| {
        assert!(e.id > last, "ids not increasing");
        last = e.id;
        read.push(e.entry.clone());
        Ok::<_, StoreError>(())
    })
    .await
    .unwrap();
    assert_eq!(read.len(), all.len());
    for (at, (got, appended)) in read.iter().zip(&all).enumerate() {
        assert_eq!(got, appended, "entry {at} read back differently");
    }
}

pub async fn verify_finds_problems<S: LedgerStore>(s: &S) {
    let mut entries = lifecycle("b1", "vision", "u1", 1, 2);
    // An orphan post: a different admission with no reservation.
    let mut orphan = entries[2].clone();
    orphan.admission = 2;
    orphan.key = orphan.derived_key().unwrap();
    // Over-posting: the void releases more than is left.
    entries.last_mut().unwrap().credits += 1;
    entries.push(orphan);
    s.append(&entries).await.unwrap();
    let report = verify(s).await.unwrap();
    assert!(!report.ok());
    let text = report.problems.join("\n");
    assert!(text.contains("without a Reserve"), "{text}");
    assert!(text.contains("exceed reserved"), "{text}");
}

/// `entries` (from [`lifecycle`], grant removed) as admission `admission` of the
/// same workload: keys re-derived.
fn readmit(entries: &[Entry], admission: u32) -> Vec<Entry> {
    entries
        .iter()
        .filter(|e| e.kind != EntryKind::Grant)
        .map(|e| {
            let mut e = e.clone();
            e.admission = admission;
            e.key = e.derived_key().expect("readmit: Reserve, Post or Void");
            e
        })
        .collect()
}

fn contents(stored: &[StoredEntry]) -> Vec<Entry> {
    stored.iter().map(|s| s.entry.clone()).collect()
}

pub async fn entries_for_workload_and_by_key<S: LedgerStore>(s: &S) {
    let u1 = lifecycle("b1", "vision", "u1", 1, 2);
    let mut u2 = lifecycle("b1", "vision", "u2", 2, 3);
    u2.remove(0); // the same grant as u1's
    // A prefix of the uid and a second admission of u1, interleaved.
    let mut u10 = lifecycle("b2", "nlp", "u10", 1, 1);
    u10.remove(0);
    let u1_again = readmit(&lifecycle("b1", "vision", "u1", 3, 1), 2);
    s.append(&u1).await.unwrap();
    s.append(&u2[..2]).await.unwrap();
    s.append(&u10).await.unwrap();
    s.append(&u1_again).await.unwrap();
    s.append(&u2[2..]).await.unwrap();

    let got = s.entries_for_workload("u1").await.unwrap();
    let expected: Vec<Entry> = u1[1..].iter().chain(&u1_again).cloned().collect();
    assert_eq!(contents(&got), expected, "u1's entries, in id order");
    assert!(
        got.windows(2).all(|w| w[0].id < w[1].id),
        "ids not increasing"
    );
    assert!(got.iter().all(|e| e.entry.workload_uid == "u1"));
    assert_eq!(contents(&s.entries_for_workload("u2").await.unwrap()), u2);
    assert_eq!(contents(&s.entries_for_workload("u10").await.unwrap()), u10);
    assert!(s.entries_for_workload("u").await.unwrap().is_empty());
    assert!(s.entries_for_workload("nobody").await.unwrap().is_empty());

    let reserve = s
        .entry_by_key(&u1_again[0].key)
        .await
        .unwrap()
        .expect("u1's second reserve");
    assert_eq!(reserve.entry, u1_again[0]);
    assert_eq!(
        Some(reserve.id),
        got.iter()
            .find(|e| e.entry.key == reserve.entry.key)
            .map(|e| e.id)
    );
    let void = s
        .entry_by_key(&u2.last().unwrap().key)
        .await
        .unwrap()
        .expect("u2's void");
    assert_eq!(&void.entry, u2.last().unwrap());
    assert!(void.id > reserve.id);
    assert_eq!(
        s.entry_by_key(&u1[0].key).await.unwrap().unwrap().entry,
        u1[0]
    );
    let line = |budget, admission| LineRef {
        budget,
        admission,
        ..u1[1].line()
    };
    assert_eq!(
        s.entry_by_key(&reserve_key(&line("b1", 3), u1[1].start))
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        s.entry_by_key(&reserve_key(&line("b2", 1), u1[1].start))
            .await
            .unwrap(),
        None
    );
}

/// (reserve key, posted, posted_until) of each open reservation.
async fn open_summary<S: LedgerStore>(s: &S) -> Vec<(String, i128, i64)> {
    let open: Vec<OpenReservation> = s.open_reservations().await.unwrap();
    assert!(
        open.windows(2).all(|w| w[0].reserve.id < w[1].reserve.id),
        "open reservations not in id order"
    );
    for o in &open {
        assert_eq!(o.reserve.entry.kind, EntryKind::Reserve);
        let stored = s.entry_by_key(&o.reserve.entry.key).await.unwrap();
        assert_eq!(stored.as_ref(), Some(&o.reserve));
    }
    open.into_iter()
        .map(|o| (o.reserve.entry.key, o.posted, o.posted_until))
        .collect()
}

pub async fn open_reservations_track_posts_and_voids<S: LedgerStore>(s: &S) {
    let t0 = 1_767_225_600;
    assert!(s.open_reservations().await.unwrap().is_empty());
    // a: 4 devices, 3 posts of 16 credits, still open.
    let mut a = lifecycle("b1", "vision", "u1", 4, 3);
    let a_void = a.pop().unwrap();
    // b: reserved, never posted.
    let mut b = lifecycle("b1", "vision", "u2", 1, 0);
    b.remove(0);
    let b_void = b.pop().unwrap();
    // c: posted twice and voided: closed.
    let mut c = lifecycle("b2", "nlp", "u3", 2, 2);
    c.remove(0);
    // d: u1's second admission, one post of 4 credits: its posts and a's must not mix.
    let mut d = readmit(&lifecycle("b1", "vision", "u1", 1, 1), 2);
    let d_void = d.pop().unwrap();
    // Stray entries of the same uid and admission in another budget: a void
    // matching b but for budget b3, a post matching a but for budget b3.
    let mut stray = lifecycle("b3", "vision", "u2", 1, 0).pop().unwrap();
    assert_eq!(stray.kind, EntryKind::Void);
    stray.credits = 1;
    let mut stray_post = lifecycle("b3", "vision", "u1", 9, 1)[2].clone();
    assert_eq!(stray_post.kind, EntryKind::Post);
    stray_post.start = t0 + 5 * 3600;
    stray_post.end = t0 + 6 * 3600;
    stray_post.key = stray_post.derived_key().unwrap();
    s.append(&a[..3]).await.unwrap(); // grant, reserve, first post
    s.append(&b).await.unwrap();
    s.append(&c).await.unwrap();
    s.append(&d).await.unwrap();
    s.append(&a[3..]).await.unwrap();
    s.append(&[stray, stray_post]).await.unwrap();

    let (a_key, b_key, d_key) = (a[1].key.clone(), b[0].key.clone(), d[0].key.clone());
    assert_eq!(
        open_summary(s).await,
        vec![
            (a_key.clone(), 48_000_000, t0 + 3 * 3600),
            (b_key.clone(), 0, t0),
            (d_key.clone(), 4_000_000, t0 + 3600),
        ]
    );
    let open = s.open_reservations().await.unwrap();
    assert_eq!(open[0].reserve.entry, a[1]);
    assert_eq!(open[1].reserve.entry, b[0]);

    // The void closes a; a post on b counts.
    s.append(&[a_void]).await.unwrap();
    let mut b_post = b[0].clone();
    b_post.kind = EntryKind::Post;
    b_post.start = t0 + 7200;
    b_post.end = t0 + 9000;
    b_post.credits = 2_000_000;
    b_post.key = b_post.derived_key().unwrap();
    s.append(&[b_post]).await.unwrap();
    assert_eq!(
        open_summary(s).await,
        vec![
            (b_key.clone(), 2_000_000, t0 + 9000),
            (d_key.clone(), 4_000_000, t0 + 3600),
        ]
    );
    s.append(&[b_void, d_void]).await.unwrap();
    assert!(s.open_reservations().await.unwrap().is_empty());
}

pub async fn posted_between_is_half_open_per_budget<S: LedgerStore>(s: &S) {
    let t0 = 1_767_225_600;
    let h = 3600;
    // b1: posts of 16 credits ending at t0+1h, +2h, +3h; the void (112 credits)
    // ends at t0+3h, the reserve at t0+10h, the grant at t0+30d.
    let b1 = lifecycle("b1", "vision", "u1", 4, 3);
    // A refund of 6 credits for the second hour (ends at t0+2h).
    let refund = Entry {
        key: correction_key("b1", "u1", 1, t0 + h, t0 + 2 * h, "refund"),
        kind: EntryKind::Correction,
        credits: -6_000_000,
        reason: "refund".into(),
        ..b1[3].clone()
    };
    assert_eq!(refund.end, t0 + 2 * h);
    // b2: posts of 4 credits at the same times; "b1x" a budget sharing the prefix.
    let b2 = lifecycle("b2", "nlp", "u2", 1, 3);
    let b1x = lifecycle("b1x", "nlp", "u3", 1, 3);
    s.append(&b1).await.unwrap();
    s.append(&b2).await.unwrap();
    s.append(&b1x).await.unwrap();
    s.append(&[refund]).await.unwrap();

    let between = |budget: &'static str, a: i64, b: i64| async move {
        s.posted_between(budget, t0 + a, t0 + b).await.unwrap()
    };
    assert_eq!(between("b1", h, 3 * h).await, 32_000_000 - 6_000_000);
    assert_eq!(
        between("b1", h, 2 * h).await,
        16_000_000,
        "`to` is excluded"
    );
    assert_eq!(between("b1", 2 * h, 3 * h).await, 16_000_000 - 6_000_000);
    assert_eq!(
        between("b1", 0, h).await,
        0,
        "a post ending at `to` is excluded"
    );
    assert_eq!(between("b1", 2 * h, 2 * h).await, 0);
    assert_eq!(
        between("b1", 3 * h, 4 * h).await,
        16_000_000,
        "the void is no post"
    );
    assert_eq!(between("b1", 0, 100 * 86_400).await, 48_000_000 - 6_000_000);
    assert_eq!(between("b2", 0, 100 * 86_400).await, 12_000_000);
    assert_eq!(between("b2", h + 1, 3 * h + 1).await, 8_000_000);
    assert_eq!(between("b1x", 0, 100 * 86_400).await, 12_000_000);
    assert_eq!(between("b", 0, 100 * 86_400).await, 0);
    assert_eq!(between("nobody", 0, 100 * 86_400).await, 0);
}

/// A line renewed for a second term and a second line of the same admission
/// (another flavor): one open reservation per line, the terms summed, the lines'
/// posts kept apart; verify accepts both terms and one void per line.
pub async fn open_reservations_fold_terms_per_line<S: LedgerStore>(s: &S) {
    let t0 = 1_767_225_600;
    // Line a: 10 h reserved, 2 posts, then a renewal for the next 10 h.
    let mut a = lifecycle("b1", "vision", "u1", 1, 2);
    let a_void = a.pop().unwrap();
    let mut renewal = a[1].clone();
    renewal.start = t0 + 36_000;
    renewal.end = t0 + 72_000;
    renewal.key = renewal.derived_key().unwrap();
    // Line b: the same admission on another flavor, 3 devices, one post.
    let mut b: Vec<Entry> = lifecycle("b1", "vision", "u1", 3, 1)
        .into_iter()
        .skip(1)
        .map(|mut e| {
            e.flavor = "nvidia-a100".into();
            e.key = e.derived_key().unwrap();
            e
        })
        .collect();
    let b_void = b.pop().unwrap();
    assert_ne!(b[0].key, a[1].key);
    s.append(&a).await.unwrap();
    s.append(&b).await.unwrap();
    s.append(std::slice::from_ref(&renewal)).await.unwrap();
    let open = s.open_reservations().await.unwrap();
    assert_eq!(open.len(), 2, "{open:?}");
    assert_eq!(open[0].reserve.entry, a[1]);
    assert_eq!(open[0].reserved, 2 * 40_000_000);
    assert_eq!(open[0].reserved_until, t0 + 72_000);
    assert_eq!(
        (open[0].posted, open[0].posted_until),
        (8_000_000, t0 + 7200)
    );
    assert_eq!(open[0].open(), 72_000_000);
    assert_eq!(open[1].reserve.entry, b[0]);
    assert_eq!(open[1].reserved, 120_000_000);
    assert_eq!(
        (open[1].posted, open[1].posted_until),
        (12_000_000, t0 + 3600)
    );
    // Voiding line b leaves line a open.
    s.append(std::slice::from_ref(&b_void)).await.unwrap();
    let open = s.open_reservations().await.unwrap();
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].reserve.entry.flavor, "nvidia-h100");
    // Line a's void releases both terms but the posts.
    let mut a_void = a_void;
    a_void.credits = 80_000_000 - 8_000_000;
    s.append(&[a_void]).await.unwrap();
    assert!(s.open_reservations().await.unwrap().is_empty());
    let report = verify(s).await.unwrap();
    assert!(report.ok(), "{:?}", report.problems);
    assert_eq!(report.reservations, 2, "one reservation per line");
}
