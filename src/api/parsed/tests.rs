//! The parser: the examples, every field error, the parsed amounts.
use super::*;
use crate::api::CreditBudget;
use crate::api::rates::Rate;

#[test]
fn the_examples_parse_to_their_amounts_and_rates() {
    let loaded = crate::testkit::examples();
    for class in &loaded.classes {
        let parsed = parse_class(&class.spec, class.metadata.generation);
        assert!(parsed.is_valid(), "{:?}", parsed.errors);
        let rates = parsed.rates.expect("rates parse");
        let base: Credits = class.spec.credits.per_device_hour.parse().unwrap();
        assert_eq!(rates.for_model("no-override-matches-this"), Rate(base.0));
    }
    for budget in &loaded.budgets {
        let amounts = parse_budget(&budget.spec).expect("example budgets parse");
        assert_eq!(
            amounts.per_period,
            budget.spec.credits.per_period.parse::<Credits>().unwrap()
        );
        assert_eq!(amounts.team, budget.spec.team);
        assert_eq!(amounts.period.days, budget.spec.credits.period.days);
        assert_eq!(
            amounts.period.start,
            budget.spec.credits.period.start.0.as_second()
        );
        assert_eq!(amounts.top_ups.len(), budget.spec.credits.top_ups.len());
    }
}

/// A valid budget but for `per_period`, `days` and `top_ups` (name, credits,
/// reason).
fn budget_spec(per_period: &str, days: u32, top_ups: &[(&str, &str, &str)]) -> CreditBudgetSpec {
    serde_json::from_value(serde_json::json!({
            "team": "vision",
            "namespaces": ["vision"],
            "classes": [{"name": "x"}],
            "credits": {
                "perPeriod": per_period,
                "period": {"start": "2025-12-01T00:00:00Z", "days": days},
                "topUps": top_ups
                    .iter()
                    .map(|(name, credits, reason)| serde_json::json!({"name": name, "credits": credits, "reason": reason}))
                    .collect::<Vec<_>>(),
            },
        }))
        .unwrap()
}

#[test]
fn a_budget_parses_to_its_team_period_and_top_ups() {
    let parsed = parse_budget(&budget_spec(
        "100.5",
        30,
        &[("q3-extra", "50.5", "launch"), ("b", "0.000001", "")],
    ))
    .unwrap();
    assert_eq!(parsed.team, "vision");
    assert_eq!(parsed.per_period, Credits(100_500_000));
    assert_eq!(
        parsed.period,
        ParsedPeriod {
            start: 1_764_547_200, // 2025-12-01T00:00:00Z
            days: 30
        }
    );
    assert_eq!(
        parsed.top_ups,
        [
            ParsedTopUp {
                name: "q3-extra".into(),
                reason: Some("launch".into()),
                credits: Credits(50_500_000),
            },
            // An empty reason is no reason.
            ParsedTopUp {
                name: "b".into(),
                reason: None,
                credits: Credits(1),
            },
        ]
    );
    for days in [1, 366] {
        assert_eq!(
            parse_budget(&budget_spec("1", days, &[]))
                .unwrap()
                .period
                .days,
            days
        );
    }
}

/// The fields the ledger grants from (moved from `ledger::budget`, which now
/// receives only parsed budgets): each bad value is named by its field, with
/// the fix.
#[test]
fn bad_ledger_fields_are_named() {
    let only = |spec: CreditBudgetSpec| {
        let errors = parse_budget(&spec).unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:?}");
        errors.into_iter().next().unwrap()
    };
    let e = only(budget_spec("lots", 30, &[]));
    assert_eq!(e.field, "spec.credits.perPeriod", "{e}");
    assert!(e.to_string().contains("spec.credits.perPeriod"), "{e}");
    for bad in ["-50", "0", "0.0000001", "x"] {
        let e = only(budget_spec("1", 30, &[("a", bad, "")]));
        assert_eq!(e.field, "spec.credits.topUps[0].credits", "{bad}: {e}");
        assert!(
            e.message.contains("must be a positive decimal")
                && e.message.contains("lower perPeriod"),
            "{bad}: {e}"
        );
        assert!(e.to_string().contains("spec.credits.topUps"), "{e}");
    }
    let e = only(budget_spec("1", 30, &[("A/b", "1", "")]));
    assert_eq!(e.field, "spec.credits.topUps[0].name", "{e}");
    assert!(e.message.contains("is not a DNS label"), "{e}");
    let e = only(budget_spec("1", 30, &[("a", "1", ""), ("a", "2", "")]));
    assert_eq!(e.field, "spec.credits.topUps[1].name", "{e}");
    assert!(e.message.contains("used twice"), "{e}");
    for days in [0, 367] {
        let e = only(budget_spec("1", days, &[]));
        assert_eq!(e.field, "spec.credits.period.days", "{days}: {e}");
        assert!(e.to_string().contains("spec.credits.period.days"), "{e}");
    }
}

#[test]
fn every_error_of_a_budget_is_named_and_nothing_is_parsed() {
    let budget: CreditBudget = serde_yaml::from_str(
        r#"
apiVersion: kaccel.io/v1alpha1
kind: CreditBudget
metadata: {name: b}
spec:
  team: Vision
  namespaces: [vision]
  classes: [{name: x}]
  fairShareWeight: "2.5000"
  credits:
    perPeriod: "1.1234567"
    period: {start: "2026-12-01T00:00:00Z", days: 30}
    topUps: [{name: q3, credits: "0"}, {name: q3, credits: "5"}]
  admission: {overdraftLimit: "500", defaultHorizonSeconds: 31536001}
"#,
    )
    .unwrap();
    let errors = parse_budget(&budget.spec).unwrap_err();
    let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.team",
            "spec.credits.perPeriod",
            "spec.admission.defaultHorizonSeconds",
            "spec.admission.overdraftLimit",
            "spec.credits.topUps[0].credits",
            "spec.credits.topUps[1].name",
            "spec.fairShareWeight",
        ],
        "{errors:?}"
    );
}
