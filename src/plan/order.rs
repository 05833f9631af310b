//! Stage 5, preference order: each class's flavors in the order Kueue should try them.

use std::collections::{BTreeMap, BTreeSet};

use crate::api::AcceleratorClass;

use super::flavors::FlavorKey;
use super::{FlavorReport, name_of, names};

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
