//! Tests of charging: terms, overruns, posts past the end, renewals, refunds, every second charged.

use super::*;
use crate::ledger::admission::{FlavorUsage, RateInfo};
use crate::ledger::pricing::Rate;
use proptest::prelude::*;

fn line(flavor: &str, units: u64, rate: u64) -> ReservationLine {
    ReservationLine {
        usage: FlavorUsage {
            flavor: flavor.into(),
            resource: "nvidia.com/gpu".into(),
            device_units: units,
        },
        rate: RateInfo {
            class: "c".into(),
            model: format!("model-{flavor}"),
            rate: Rate(rate),
            rate_card: "rc-1".into(),
        },
        credits: Credits(0),
    }
}

fn charge(term: u64, lines: Vec<ReservationLine>) -> Charge {
    Charge {
        owner: ChargeOwner {
            budget: "vision".into(),
            team: "vision".into(),
            namespace: "ns".into(),
            workload: "w".into(),
            workload_uid: "uid".into(),
            admission: 1,
        },
        admitted_at: 1000,
        term_seconds: term,
        lines,
        devices: vec![],
        cluster: String::new(),
    }
}

fn ended(at: i64) -> Ended {
    Ended {
        at,
        platform_preempted: false,
        reason: "finished".into(),
    }
}

fn sum(entries: &[Entry], kind: EntryKind) -> i64 {
    entries
        .iter()
        .filter(|e| e.kind == kind)
        .map(|e| e.credits)
        .sum()
}

#[test]
fn a_run_of_three_and_a_half_terms_is_charged_in_full() {
    // 2 devices at 3600 credits/device-hour (2 credits/s), term 100 s.
    let c = charge(100, vec![line("h100", 2, 3_600_000_000)]);
    let mut state = ChargeState::default();
    let mut all = c.reserve_terms(0, 1, "reserve", 1000);
    state.apply(&c, &all);
    assert_eq!(state.terms, 1);
    for k in 1..4 {
        let due = c.renewal_due_at(state.terms);
        assert_eq!(due, 1000 + 100 * i64::from(k) - 20);
        let Renewal::Renew { entries, overdraft } = c.decide_renewal(
            state.terms,
            &granted(1_000_000),
            RenewalRule::default(),
            due,
        ) else {
            panic!("covered renewal refused")
        };
        assert!(!overdraft);
        state.apply(&c, &entries);
        all.extend(entries);
    }
    let (posts, next) = c.due_posts(&state, 1000 + 350, 60);
    assert_eq!(next, 1000 + 360);
    state.apply(&c, &posts);
    all.extend(posts);
    let settled = c.settle(&state, &ended(1000 + 350), 1350);
    all.extend(settled);
    // 350 s x 2 devices x 1 credit/s = 700 credits, no horizon clip.
    assert_eq!(sum(&all, EntryKind::Post), 700_000_000);
    assert_eq!(sum(&all, EntryKind::Reserve), 800_000_000);
    assert_eq!(sum(&all, EntryKind::Void), 100_000_000);
    for e in &all {
        e.validate().unwrap();
    }
}

#[test]
fn usage_past_the_reservation_is_reserved_as_overrun_and_charged() {
    // One term of 60 s reserved; the Workload ran 10 minutes (renewal refused,
    // or kaccel down): every second is charged.
    let c = charge(60, vec![line("a", 1, 3_600_000_000)]);
    let reserve = c.reserve_terms(0, 1, "reserve", 1000);
    let state = ChargeState::of(&c, &reserve);
    let out = c.settle(&state, &ended(1600), 1700);
    assert_eq!(sum(&out, EntryKind::Post), 600_000_000);
    let overrun: Vec<&Entry> = out
        .iter()
        .filter(|e| e.kind == EntryKind::Reserve)
        .collect();
    assert_eq!(overrun.len(), 9);
    assert!(overrun[0].reason.starts_with("overrun"));
    assert_eq!(sum(&out, EntryKind::Void), 0);
    // Periodic posts past the reservation reserve the overrun first, too.
    let (posts, _) = c.due_posts(&state, 1250, 100);
    assert_eq!(posts[0].kind, EntryKind::Reserve);
    // Boundaries every 100 s and at every 60 s term end: posted to 1240.
    assert_eq!(sum(&posts, EntryKind::Reserve), 180_000_000);
    assert_eq!(sum(&posts, EntryKind::Post), 240_000_000);
    assert_eq!(posts.last().unwrap().end, 1240);
}

#[test]
fn usage_posted_past_the_recorded_end_is_refunded_by_a_correction() {
    // Posted to 1200, then Kueue shows an end at 1150 (stamped earlier than it
    // was written): the charge is 150 s, the 50 s posted past it refunded.
    let c = charge(100, vec![line("a", 1, 3_600_000_000)]);
    let mut state = ChargeState::default();
    let reserve = c.reserve_terms(0, 2, "reserve", 1000);
    state.apply(&c, &reserve);
    let (posts, _) = c.due_posts(&state, 1200, 100);
    state.apply(&c, &posts);
    assert_eq!(state.posted_until, 1200);
    let out = c.settle(&state, &ended(1150), 1210);
    let spent = sum(&posts, EntryKind::Post)
        + sum(&out, EntryKind::Post)
        + sum(&out, EntryKind::Correction);
    assert_eq!(spent, 150_000_000);
    let correction: Vec<&Entry> = out
        .iter()
        .filter(|e| e.kind == EntryKind::Correction)
        .collect();
    assert_eq!(correction.len(), 1);
    assert_eq!((correction[0].start, correction[0].end), (1150, 1200));
    assert!(correction[0].reason.starts_with(POSTED_PAST_END));
    // Reserves still close exactly: posts + void.
    assert_eq!(
        sum(&reserve, EntryKind::Reserve),
        sum(&posts, EntryKind::Post) + sum(&out, EntryKind::Void)
    );
    for e in out.iter().chain(&posts) {
        e.validate().unwrap();
    }
}

#[test]
fn lines_are_entries_of_their_own_with_their_own_rate() {
    let c = charge(
        3600,
        vec![line("a100", 2, 1_500_000), line("mig-1g", 8, 250_000)],
    );
    let reserve = c.reserve_terms(0, 1, "reserve", 1000);
    assert_eq!(reserve.len(), 2);
    assert_eq!(reserve[0].flavor, "a100");
    assert_eq!(reserve[0].credits, 3_000_000);
    assert_eq!(reserve[0].rate, 1_500_000);
    assert_eq!(reserve[1].flavor, "mig-1g");
    assert_eq!(reserve[1].credits, 2_000_000);
    assert_ne!(reserve[0].key, reserve[1].key);
    let state = ChargeState::of(&c, &reserve);
    let out = c.settle(&state, &ended(1000 + 1800), 2800);
    let voids: Vec<i64> = out
        .iter()
        .filter(|e| e.kind == EntryKind::Void)
        .map(|e| e.credits)
        .collect();
    assert_eq!(voids, vec![1_500_000, 1_000_000]);
}

fn granted(credits: u64) -> Balances {
    let mut b = Balances::default();
    b.apply(EntryKind::Grant, Credits::whole(credits).0 as i64);
    b
}

#[test]
fn a_renewal_the_budget_cannot_cover_stops_or_overdraws() {
    let c = charge(3600, vec![line("h100", 4, 100_000_000)]);
    // 400 credits a term; 120 left.
    match c.decide_renewal(1, &granted(120), RenewalRule::default(), 5000) {
        Renewal::Stop { message } => {
            assert!(
                message.contains("budget vision of team vision"),
                "{message}"
            );
            assert!(message.contains("need 400 credits"), "{message}");
            assert!(message.contains("120 are left"), "{message}");
            assert!(message.contains("short by 280"), "{message}");
            assert!(message.contains("spec.active=false"), "{message}");
            assert!(message.contains("whenRenewalShort: Overdraft"), "{message}");
        }
        r => panic!("{r:?}"),
    }
    let rule = RenewalRule {
        allow_overdraft: true,
        overdraft_limit: Credits::whole(300),
    };
    match c.decide_renewal(1, &granted(120), rule, 5000) {
        Renewal::Renew { entries, overdraft } => {
            assert!(overdraft);
            assert_eq!(entries.len(), 1);
            assert_eq!(entries[0].start, 1000 + 3600);
            assert!(
                entries[0].reason.contains("overdraft"),
                "{}",
                entries[0].reason
            );
        }
        r => panic!("{r:?}"),
    }
    // Past the overdraft limit: stop.
    match c.decide_renewal(1, &granted(50), rule, 5000) {
        Renewal::Stop { message } => {
            assert!(message.contains("overdraft limit 300"), "{message}");
            assert!(message.contains("short by 50"), "{message}");
            assert!(
                message.contains("raise spec.admission.overdraftLimit"),
                "{message}"
            );
        }
        r => panic!("{r:?}"),
    }
}

#[test]
fn preemption_refunds_each_line() {
    let c = charge(3600, vec![line("a", 1, 1_000_000), line("b", 1, 2_000_000)]);
    let posted = BTreeMap::from([
        (("a".to_string(), "nvidia.com/gpu".to_string()), 5),
        (("b".to_string(), "nvidia.com/gpu".to_string()), 7),
    ]);
    let mut e = ended(2000);
    assert!(c.preemption_refunds(&posted, &e).is_empty());
    e.platform_preempted = true;
    let r = c.preemption_refunds(&posted, &e);
    assert_eq!(
        r.iter().map(|e| e.credits).collect::<Vec<_>>(),
        vec![-5, -7]
    );
    assert_ne!(r[0].key, r[1].key);
}

proptest! {
    /// However the run is cut into posts, renewals and a settlement (posts
    /// written past the end included), each line's charge (posts and their
    /// corrections) equals rate x units x admitted seconds (floored
    /// cumulatively), reserves cover posts + voids exactly, and every entry is
    /// valid.
    #[test]
    fn every_admitted_second_is_charged(
        rates in proptest::collection::vec((0u64..10_000_000_000, 0u64..64), 1..4),
        term in 1u64..5000, ran in 0i64..50_000,
        checks in proptest::collection::vec(0i64..50_000, 0..12),
        interval in 1u64..4000, renew in any::<bool>()) {
        let lines: Vec<ReservationLine> = rates.iter().enumerate()
            .map(|(i, (r, u))| line(&format!("f{i}"), *u, *r)).collect();
        let c = charge(term, lines);
        let end = c.admitted_at + ran;
        let mut all = c.reserve_terms(0, 1, "reserve", c.admitted_at);
        let mut state = ChargeState::of(&c, &all);
        // Some checks come after the end (kaccel posted before it saw the end).
        let mut times: Vec<i64> = checks.into_iter().map(|t| c.admitted_at + t % (ran + 5000)).collect();
        times.sort_unstable();
        for now in times {
            let rich = Balances { granted: i128::MAX / 4, ..Default::default() };
            if renew
                && now >= c.renewal_due_at(state.terms)
                && let Renewal::Renew { entries, .. } = c.decide_renewal(state.terms, &rich, RenewalRule::default(), now)
            {
                state.apply(&c, &entries);
                all.extend(entries);
            }
            let (posts, _) = c.due_posts(&state, now, interval);
            state.apply(&c, &posts);
            all.extend(posts);
        }
        let settled = c.settle(&state, &ended(end), end);
        all.extend(settled);
        for l in &c.lines {
            let mine = |k: EntryKind| -> i64 { all.iter().filter(|e| e.kind == k && e.flavor == l.usage.flavor).map(|e| e.credits).sum() };
            let expected = cumulative(l.rate.rate, l.usage.device_units, u64::try_from(ran).unwrap()).unwrap().0 as i64;
            prop_assert_eq!(mine(EntryKind::Post) + mine(EntryKind::Correction), expected);
            prop_assert!(mine(EntryKind::Correction) <= 0);
            prop_assert_eq!(mine(EntryKind::Reserve), mine(EntryKind::Post) + mine(EntryKind::Void));
        }
        let mut keys: Vec<&str> = all.iter().map(|e| e.key.as_str()).collect();
        keys.sort_unstable();
        let n = keys.len();
        keys.dedup();
        prop_assert_eq!(keys.len(), n, "duplicate keys");
        for e in &all { prop_assert!(e.validate().is_ok(), "{:?}", e.validate()); }
    }
}
