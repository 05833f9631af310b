//! Stage 1 of the planner, [`classes`]: every class parsed ([`crate::api::parsed`]),
//! invalid ones reported with their field errors; budgets are parsed when they
//! are admitted (stage 6).

use std::collections::BTreeMap;

use crate::api::AcceleratorClass;
use crate::api::parsed::parse_class;

use super::{ClassReport, name_of};

/// Stage 1: the classes in name order, and a report per class name saying whether
/// it is valid and why not. Invalid classes take no part in the later stages.
pub(super) fn classes(
    classes: &[AcceleratorClass],
) -> (Vec<&AcceleratorClass>, BTreeMap<String, ClassReport>) {
    let mut ordered: Vec<&AcceleratorClass> = classes.iter().collect();
    ordered.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut class_reports: BTreeMap<String, ClassReport> = BTreeMap::new();
    for class in &ordered {
        let parsed = parse_class(&class.spec, class.metadata.generation);
        class_reports.insert(
            name_of(&class.metadata),
            ClassReport {
                valid: parsed.is_valid(),
                errors: parsed.errors,
                rates: Some(parsed.rates),
                devices_per_pod: parsed.devices_per_pod,
                ..Default::default()
            },
        );
    }
    (ordered, class_reports)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{HardwareSelector, SharingMode};
    use crate::plan::tests::class;

    #[test]
    fn classes_come_back_in_name_order_each_with_a_report() {
        let partition_without_profile = class(
            "b-part",
            SharingMode::Partition,
            HardwareSelector::default(),
        );
        let whole = class("a-whole", SharingMode::Whole, HardwareSelector::default());
        let input = [partition_without_profile, whole];
        let (ordered, reports) = classes(&input);
        let names: Vec<String> = ordered.iter().map(|c| name_of(&c.metadata)).collect();
        assert_eq!(names, ["a-whole", "b-part"]);
        assert!(reports["a-whole"].valid && reports["a-whole"].errors.is_empty());
        let invalid = &reports["b-part"];
        assert!(!invalid.valid);
        assert_eq!(invalid.errors[0].field, "spec.selector.partitionProfile");
    }
}
