//! The store test suite, run unchanged against every backend (tests/ledger.rs for
//! SQLite, tests/ledger_postgres.rs for PostgreSQL). Each function takes a fresh,
//! empty store and panics on a failed check.

use super::entry::{Entry, EntryKind, correction_key, grant_key, post_key, reserve_key, void_key};
use super::pricing::{Rate, price_interval};
use super::store::{EntryFilter, LedgerStore, PAGE, StoreError, for_each_entry, verify};

/// A grant, a reservation of 10 h of `units` devices at 4 credits/h, hourly posts
/// for `hours` hours and the void of the rest, for one workload admission.
pub fn lifecycle(budget: &str, team: &str, uid: &str, units: u64, hours: i64) -> Vec<Entry> {
    let t0 = 1_767_225_600;
    let rate = Rate(4_000_000);
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
    };
    let price = |a, b| price_interval(rate, units, t0, a, b).unwrap().0 as i64;
    let reserved = price(t0, t0 + 36_000);
    let mut out = vec![
        Entry {
            key: grant_key(budget, t0),
            kind: EntryKind::Grant,
            workload_uid: String::new(),
            namespace: String::new(),
            workload: String::new(),
            class: String::new(),
            flavor: String::new(),
            resource: String::new(),
            device_units: 0,
            credits: 1_000_000_000,
            end: t0 + 30 * 86_400,
            ..base.clone()
        },
        Entry {
            key: reserve_key(budget, uid, 1),
            credits: reserved,
            ..base.clone()
        },
    ];
    let mut posted = 0;
    for h in 0..hours {
        let (a, b) = (t0 + h * 3600, t0 + (h + 1) * 3600);
        posted += price(a, b);
        out.push(Entry {
            key: post_key(budget, uid, 1, a, b),
            kind: EntryKind::Post,
            start: a,
            end: b,
            credits: price(a, b),
            created_at: b,
            ..base.clone()
        });
    }
    out.push(Entry {
        key: void_key(budget, uid, 1),
        kind: EntryKind::Void,
        credits: reserved - posted,
        end: t0 + hours * 3600,
        ..base
    });
    out
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
        e.key = post_key("hourly", "u", 1, t, b);
        e.start = t;
        e.end = b;
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
        let team = if w % 2 == 0 { "vision" } else { "nlp" };
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
}

pub async fn verify_finds_problems<S: LedgerStore>(s: &S) {
    let mut entries = lifecycle("b1", "vision", "u1", 1, 2);
    // An orphan post: a different admission with no reservation.
    let mut orphan = entries[2].clone();
    orphan.admission = 2;
    orphan.key = post_key("b1", "u1", 2, orphan.start, orphan.end);
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
