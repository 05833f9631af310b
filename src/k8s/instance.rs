//! One installation of kaccel among others in the same cluster: its `instance`
//! name (config `instance`, default `kaccel`) scopes everything it owns, so two
//! installations with different instances never touch each other's objects.
//!
//! - Objects it writes carry `app.kubernetes.io/managed-by=<instance>`; an
//!   object with another value is someone else's (another installation
//!   included) and is never changed or deleted.
//! - The AcceleratorClasses and CreditBudgets it serves carry
//!   `kaccel.io/instance=<instance>`; those without the label belong to the
//!   default installation, so a cluster with one kaccel needs no label at all.
//! - Its field manager, root Cohort, Lease, AdmissionCheck, the check's
//!   controller name and its Workload finalizer are derived from the instance
//!   (each may still be set in the config). The default instance derives
//!   exactly the names kaccel used before instances existed, so upgrading an
//!   installation changes none of its objects.

use std::collections::BTreeMap;

use super::labels::MANAGED_BY_LABEL;

/// The instance of an installation whose config names none.
pub const DEFAULT_INSTANCE: &str = "kaccel";
/// On an AcceleratorClass or CreditBudget: the installation that serves it.
pub const INSTANCE_LABEL: &str = "kaccel.io/instance";
/// Longest instance name: the longest derived name (`<instance>-controller`,
/// the finalizer's `credits-<instance>`) must stay a valid label value (63).
pub const MAX_INSTANCE_LEN: usize = 40;

/// Whether `instance` is usable: a DNS label (lower-case letters, digits, `-`,
/// alphanumeric at both ends) of at most [`MAX_INSTANCE_LEN`] characters.
pub fn valid_instance(instance: &str) -> bool {
    instance.len() <= MAX_INSTANCE_LEN
        && !instance.contains('.')
        && super::names::valid_dns_subdomain(instance)
}

/// Whether the installation `instance` serves the AcceleratorClass or
/// CreditBudget carrying `labels`.
pub fn serves(instance: &str, labels: &BTreeMap<String, String>) -> bool {
    match labels.get(INSTANCE_LABEL) {
        Some(value) => value == instance,
        None => instance == DEFAULT_INSTANCE,
    }
}

/// The installation serving an object with `labels` (for messages).
pub fn served_by(labels: &BTreeMap<String, String>) -> &str {
    labels
        .get(INSTANCE_LABEL)
        .map(String::as_str)
        .unwrap_or(DEFAULT_INSTANCE)
}

/// Whether an object with `labels` was written by the installation `instance`.
pub fn owns(instance: &str, labels: &BTreeMap<String, String>) -> bool {
    labels.get(MANAGED_BY_LABEL).map(String::as_str) == Some(instance)
}

/// The label selector of everything `instance` writes.
pub fn managed_selector(instance: &str) -> String {
    format!("{MANAGED_BY_LABEL}={instance}")
}

/// `kaccel.io/credits` for the default instance, `kaccel.io/credits-<instance>`
/// for another: the credit check's finalizer on a charged Workload.
pub fn credits_finalizer(instance: &str) -> String {
    scoped_path(instance, "kaccel.io/credits")
}

/// The credit AdmissionCheck's `spec.controllerName` (same form as the finalizer).
pub fn credits_controller_name(instance: &str) -> String {
    scoped_path(instance, "kaccel.io/credits")
}

/// The credit AdmissionCheck: `<instance>-credits`.
pub fn admission_check_name(instance: &str) -> String {
    format!("{instance}-credits")
}

/// The leader-election Lease: `<instance>-controller`.
pub fn lease_name(instance: &str) -> String {
    format!("{instance}-controller")
}

/// The value an installation writes in its node marks (`kaccel.io/tainted`,
/// `kaccel.io/cordoned`): `true` for the default instance, as before instances
/// existed, else the instance. It undoes only what carries its own mark.
pub fn node_mark(instance: &str) -> &str {
    if instance == DEFAULT_INSTANCE {
        "true"
    } else {
        instance
    }
}

/// The installation that wrote a node mark with this value.
pub fn node_mark_owner(value: &str) -> &str {
    if value == "true" {
        DEFAULT_INSTANCE
    } else {
        value
    }
}

fn scoped_path(instance: &str, path: &str) -> String {
    if instance == DEFAULT_INSTANCE {
        path.to_string()
    } else {
        format!("{path}-{instance}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::labels;

    #[test]
    fn the_default_instance_derives_the_names_kaccel_always_used() {
        assert_eq!(credits_finalizer(DEFAULT_INSTANCE), "kaccel.io/credits");
        assert_eq!(
            credits_controller_name(DEFAULT_INSTANCE),
            "kaccel.io/credits"
        );
        assert_eq!(admission_check_name(DEFAULT_INSTANCE), "kaccel-credits");
        assert_eq!(lease_name(DEFAULT_INSTANCE), "kaccel-controller");
        assert_eq!(
            managed_selector(DEFAULT_INSTANCE),
            "app.kubernetes.io/managed-by=kaccel"
        );
    }

    #[test]
    fn node_marks_name_their_installation() {
        assert_eq!(node_mark(DEFAULT_INSTANCE), "true");
        assert_eq!(node_mark("team-b"), "team-b");
        for instance in [DEFAULT_INSTANCE, "team-b"] {
            assert_eq!(node_mark_owner(node_mark(instance)), instance);
        }
    }

    #[test]
    fn another_instance_derives_names_of_its_own() {
        assert_eq!(credits_finalizer("team-b"), "kaccel.io/credits-team-b");
        assert_eq!(admission_check_name("team-b"), "team-b-credits");
        assert_eq!(lease_name("team-b"), "team-b-controller");
    }

    #[test]
    fn an_unlabelled_class_belongs_to_the_default_instance_only() {
        let none = labels(&[]);
        assert!(serves(DEFAULT_INSTANCE, &none));
        assert!(!serves("team-b", &none));
        let b = labels(&[(INSTANCE_LABEL, "team-b")]);
        assert!(serves("team-b", &b));
        assert!(!serves(DEFAULT_INSTANCE, &b));
        assert_eq!(served_by(&b), "team-b");
        assert_eq!(served_by(&none), DEFAULT_INSTANCE);
    }

    #[test]
    fn ownership_is_the_managed_by_value_exactly() {
        let ours = labels(&[(MANAGED_BY_LABEL, "team-b")]);
        assert!(owns("team-b", &ours));
        assert!(!owns(DEFAULT_INSTANCE, &ours));
        assert!(!owns("team-b", &labels(&[])));
    }

    #[test]
    fn instance_names_are_dns_labels_short_enough_for_every_derived_name() {
        for good in ["kaccel", "team-b", "a", &"x".repeat(MAX_INSTANCE_LEN)] {
            assert!(valid_instance(good), "{good}");
            let longest = [
                lease_name(good),
                credits_finalizer(good)
                    .split_once('/')
                    .unwrap()
                    .1
                    .to_string(),
            ];
            for name in longest {
                assert!(super::super::names::valid_label_value(&name), "{name}");
            }
        }
        for bad in [
            "",
            "Team",
            "team.b",
            "-b",
            "b-",
            "team_b",
            &"x".repeat(MAX_INSTANCE_LEN + 1),
        ] {
            assert!(!valid_instance(bad), "{bad:?}");
        }
    }
}
