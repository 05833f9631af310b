//! Stage 5, preference order: each class's flavors in the order Kueue should try them.

use std::collections::{BTreeMap, BTreeSet};

use crate::api::AcceleratorClass;

use super::flavors::FlavorKey;
use super::{FlavorReport, name_of};
use crate::k8s::names;

/// Class -> its flavor names, best first: flavors demoted for health warnings go
/// last, then the first `spec.preference` glob matching the model decides, then
/// the name. Only classes that resolved (valid ones) get an entry.
pub(super) fn preference_order(
    classes: &[&AcceleratorClass],
    class_flavors: &BTreeMap<String, BTreeSet<FlavorKey>>,
    flavor_names: &BTreeMap<FlavorKey, String>,
    flavor_reports: &BTreeMap<String, FlavorReport>,
) -> BTreeMap<String, Vec<String>> {
    let mut class_order: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for class in classes {
        let cname = name_of(&class.metadata);
        let Some(keys) = class_flavors.get(&cname) else {
            continue;
        };
        let mut names: Vec<&String> = keys.iter().map(|k| &flavor_names[k]).collect();
        names.sort_by_key(|n| {
            let r = &flavor_reports[*n];
            let rank = class
                .spec
                .preference
                .iter()
                .position(|p| names::glob_match(p, &r.model))
                .unwrap_or(usize::MAX);
            (r.demoted, rank, (*n).clone())
        });
        class_order.insert(cname, names.into_iter().cloned().collect());
    }
    class_order
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{HardwareSelector, SharingMode};
    use crate::plan::tests::class;

    #[test]
    fn demoted_flavors_go_last_then_preference_then_name() {
        let key = |zone: &str| FlavorKey {
            variant: None,
            pins: BTreeMap::new(),
            extra: BTreeMap::from([("zone".to_string(), zone.to_string())]),
        };
        let report = |model: &str, demoted: bool| FlavorReport {
            model: model.into(),
            demoted,
            ..Default::default()
        };
        let flavor_names: BTreeMap<FlavorKey, String> = ["a", "b", "c", "d"]
            .into_iter()
            .map(|n| (key(n), n.to_string()))
            .collect();
        let flavor_reports = BTreeMap::from([
            ("a".to_string(), report("NVIDIA-A100-SXM4-80GB", false)),
            ("b".to_string(), report("AMD-MI300X", true)),
            ("c".to_string(), report("AMD-MI300X", false)),
            ("d".to_string(), report("NVIDIA-A100-SXM4-40GB", false)),
        ]);
        let mut mi300_first = class("mi300", SharingMode::Whole, HardwareSelector::default());
        mi300_first.spec.preference = vec!["*MI300X*".into()];
        let unresolved = class(
            "unresolved",
            SharingMode::Whole,
            HardwareSelector::default(),
        );
        let class_flavors =
            BTreeMap::from([("mi300".to_string(), flavor_names.keys().cloned().collect())]);

        let order = preference_order(
            &[&mi300_first, &unresolved],
            &class_flavors,
            &flavor_names,
            &flavor_reports,
        );
        // c is preferred; a and d match no pattern and go by name; b is demoted.
        assert_eq!(order["mi300"], ["c", "a", "d", "b"]);
        assert!(!order.contains_key("unresolved"));
    }
}
