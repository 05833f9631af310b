//! Huawei Ascend: the Ascend device plugin (MindCluster / MindX DL).
//!
//! Resources: whole NPUs `huawei.com/Ascend910`, `huawei.com/Ascend310P`,
//! `huawei.com/Ascend310`; static vNPU templates as `huawei.com/<chip>-<template>`,
//! e.g. `huawei.com/Ascend910-4c` or `huawei.com/Ascend310P-2c.1cpu` (partition
//! profile = the template). Names ending in `-memory`/`-core` (HAMi-style
//! accounting resources) are not devices and are skipped.
//!
//! Labels (Ascend "Kubernetes labels" tables): `accelerator=huawei-Ascend910`,
//! `accelerator-type` = server form factor (`module`, `half`, `card`,
//! `module-910b-8`, `card-910b-2`, `module-910b-16`), `servertype`
//! (`Ascend910B-20`), and on newer releases `node.kubernetes.io/npu.chip.name`
//! (`910B3`). The model is the resource's chip name, refined by the chip-name label
//! (`Ascend910` + `910B3` -> `Ascend910B3`) or, failing that, by a 910B form factor
//! in `accelerator-type` (-> `Ascend910B`).
//!
//! Newer hardware. `accelerator-type` values of Atlas A3 servers (`module-a3-16`,
//! `module-a3-16-super-pod`; MindCluster docs "创建节点标签", Atlas 900 A3 SuperPoD
//! and A200T A3 Box8) are A3 modules, model `Ascend910A3`, never first-generation
//! 910. Ascend 950 (Atlas 350/850/950) nodes advertise the generic
//! `huawei.com/npu` (mind-cluster `ASCEND_950_NPU_NUM`), with `accelerator-type`
//! `350-Atlas-*`, `850-*` or `950-SuperPod-*`: model `Ascend950`, or the chip-name
//! label when present. An `accelerator-type` value kaccel does not know, on an
//! `Ascend910` or `npu` resource, is not guessed: those devices are unclassified
//! (with a warning) until kaccel learns the scheme or `node.kubernetes.io/npu.chip.name`
//! names the chip.
//!
//! Server type. The device plugin writes `servertype` = `<card type>-<AI cores>` on
//! nodes that lack it (mind-cluster v7.3.x `component/ascend-device-plugin/pkg/server/
//! manager.go` `getNewNodeLabel`: `Ascend910-32` on first-generation 910,
//! `Ascend910B-20`, `Ascend910A3-20`; card types from `ascend-common/api`). Without a
//! chip-name label, an `Ascend910` resource on a node without `accelerator-type` takes
//! its model from the card type (`Ascend910B-20` -> `Ascend910B`): before, such a 910B
//! or A3 node read as first-generation 910.
//!
//! Pin labels: `accelerator` (chip family) plus the most specific of
//! `node.kubernetes.io/npu.chip.name`, `accelerator-type` or `servertype` that the
//! node carries, so an Ascend 910B or A3 flavor never matches a first-generation 910
//! node (all expose `huawei.com/Ascend910` and `accelerator=huawei-Ascend910`). A
//! first-generation node with none of the three is pinned by `accelerator` alone: in
//! a fleet with A3 or 910B nodes its flavor selects them too, and the planner refuses
//! it, naming the labels that would tell them apart.
//!
//! Static vNPUs. Nodes with vNPU templates (`huawei.com/Ascend910-4c`) carry the same
//! labels as nodes of whole NPUs of the same chip: the device plugin writes no label
//! saying a template exists (its node labels are `accelerator`, `servertype`,
//! `node.kubernetes.io/npu.chip.name`, `huawei.com/driver.version`,
//! `mind-cluster/npu-chip-memory` and topology ids). In a fleet mixing both, the
//! vNPU flavor (and the whole flavor, on nodes cut entirely into vNPUs) selects nodes
//! without its devices and is refused; the fix is a label of the platform team's,
//! selected with the class's `spec.selector.nodeLabels`.

use std::collections::BTreeMap;

use super::{DeviceGroup, DeviceVariant, NodeView, SharingMode, Vendor};

pub(crate) const PREFIX: &str = "huawei.com/";
/// The generic NPU resource of Ascend 950-generation nodes.
pub(crate) const NPU_RESOURCE: &str = "huawei.com/npu";
pub(crate) const ACCELERATOR: &str = "accelerator";
pub(crate) const ACCELERATOR_TYPE: &str = "accelerator-type";
pub(crate) const CHIP_NAME: &str = "node.kubernetes.io/npu.chip.name";
const CHIP_MEMORY: &str = "mind-cluster/npu-chip-memory";
pub(crate) const SERVER_TYPE: &str = "servertype";

pub(crate) fn read(view: &NodeView<'_>, warnings: &mut Vec<String>) -> Vec<DeviceGroup> {
    let mut groups = Vec::new();
    let candidates: Vec<&str> = view
        .capacity
        .keys()
        .copied()
        .filter(|name| name.starts_with("huawei.com/Ascend") || *name == NPU_RESOURCE)
        .collect();
    if candidates.is_empty() {
        return groups;
    }
    let raw_labels = {
        let mut raw = view.raw_labels(&[PREFIX, "mind-cluster/", CHIP_NAME]);
        for key in [
            ACCELERATOR,
            ACCELERATOR_TYPE,
            SERVER_TYPE,
            "host-arch",
            "workerselector",
        ] {
            if let Some(v) = view.label(key) {
                raw.insert(key.to_string(), v.to_string());
            }
        }
        raw
    };
    let chip_label = view.label(CHIP_NAME);
    let accel_type = view.label(ACCELERATOR_TYPE);
    let server_type = view.label(SERVER_TYPE);
    let chip_memory = view.label_size_mib(CHIP_MEMORY, 1, warnings);
    let taint_keys: Vec<&str> = candidates.clone();
    let taints = view.taint_keys(&taint_keys);

    for resource in candidates {
        let name = &resource[PREFIX.len()..];
        let (chip, template) = match name.split_once('-') {
            Some((chip, template)) => (chip, Some(template)),
            None => (name, None),
        };
        if matches!(template, Some("memory" | "core")) || template == Some("") {
            continue;
        }
        let Some((cap, alloc)) = view.count_checked(resource, warnings) else {
            continue;
        };
        let model = match refine_model(chip, chip_label, accel_type, server_type) {
            Some(m) => m,
            None => {
                warnings.push(format!(
                    "{resource}: {ACCELERATOR_TYPE}={:?} and {SERVER_TYPE}={:?} name no Ascend hardware kaccel knows and no {CHIP_NAME} label names the chip; devices left unclassified",
                    accel_type.unwrap_or(""),
                    server_type.unwrap_or("")
                ));
                format!("{resource}-unlabelled")
            }
        };
        let mut pins = BTreeMap::new();
        match view.label(ACCELERATOR) {
            Some(a) => {
                pins.insert(ACCELERATOR.to_string(), a.to_string());
            }
            None => warnings.push(format!(
                "{resource}: node has no {ACCELERATOR} label (set by the Ascend device plugin); \
                 the flavor is pinned by the remaining labels only"
            )),
        }
        if let Some(c) = chip_label {
            pins.insert(CHIP_NAME.to_string(), c.to_string());
        } else if let Some(t) = accel_type {
            pins.insert(ACCELERATOR_TYPE.to_string(), t.to_string());
        } else if let Some(t) = server_type {
            pins.insert(SERVER_TYPE.to_string(), t.to_string());
        }
        let (sharing, profile) = match template {
            Some(t) => (SharingMode::Partition, Some(t.to_string())),
            None => (SharingMode::Whole, None),
        };
        let mut g = DeviceGroup::new(
            DeviceVariant {
                vendor: Vendor::Huawei,
                model: model.clone(),
                sharing,
                partition_profile: profile,
                resource_name: resource.to_string(),
            },
            cap,
            alloc,
        );
        g.memory_mib = if template.is_none() {
            chip_memory.or_else(|| known_memory_mib(&model))
        } else {
            None
        };
        g.architecture =
            Some(model.trim_start_matches("Ascend").to_ascii_lowercase()).filter(|a| !a.is_empty());
        g.pin_labels = pins;
        g.vendor_taint_keys = taints.clone();
        g.raw_labels = raw_labels.clone();
        groups.push(g);
    }
    groups
}

/// `Ascend910` + chip label `910B3` -> `Ascend910B3`; + accelerator-type
/// `module-910b-8` -> `Ascend910B`, `module-a3-16` -> `Ascend910A3`; without
/// accelerator-type, + servertype `Ascend910B-20` -> `Ascend910B`; `npu` +
/// `950-SuperPod-Atlas-8` -> `Ascend950`. None: a form factor kaccel does not know.
fn refine_model(
    chip: &str,
    chip_label: Option<&str>,
    accel_type: Option<&str>,
    server_type: Option<&str>,
) -> Option<String> {
    if let Some(label) = chip_label {
        let label = label.trim();
        let full = if label.starts_with("Ascend") {
            label.to_string()
        } else {
            format!("Ascend{label}")
        };
        // Only refine, never contradict: the label must extend the resource's chip
        // (the generic `npu` resource names no chip, so the label names it).
        if full.starts_with(chip) || chip == "npu" {
            return Some(full);
        }
    }
    let t = accel_type.map(str::to_ascii_lowercase);
    // A card type of the plugin's form that kaccel does not know is not guessed.
    let card = match server_type.map(card_type) {
        Some(CardType::Unknown) => return None,
        Some(CardType::Known(c)) => Some(c),
        Some(CardType::Other) | None => None,
    };
    match (chip, t.as_deref()) {
        ("npu", Some(t))
            if t.starts_with("350-atlas") || t.starts_with("850-") || t.starts_with("950-") =>
        {
            Some("Ascend950".to_string())
        }
        ("npu", _) => None,
        ("Ascend910", None) => Some(card.unwrap_or(chip).to_string()),
        ("Ascend910", Some("module" | "half" | "card" | "module-8")) => Some(chip.to_string()),
        ("Ascend910", Some(t)) if t.contains("910b") || t.starts_with("module-b") => {
            Some("Ascend910B".to_string())
        }
        ("Ascend910", Some(t)) if t.contains("a3") => Some("Ascend910A3".to_string()),
        ("Ascend910", Some(_)) => None,
        _ => Some(chip.to_string()),
    }
}

enum CardType {
    Known(&'static str),
    /// `Ascend910<something>-<cores>`: the plugin's form, a card kaccel does not know.
    Unknown,
    /// Not the plugin's form (a value the platform team set).
    Other,
}

/// The card type of a `servertype` value the device plugin writes
/// (`<card type>-<AI core count>`), for the 910 card types kaccel knows.
fn card_type(server_type: &str) -> CardType {
    let Some((card, cores)) = server_type.trim().rsplit_once('-') else {
        return CardType::Other;
    };
    if cores.is_empty() || !cores.bytes().all(|b| b.is_ascii_digit()) {
        return CardType::Other;
    }
    match card {
        "Ascend910" => CardType::Known("Ascend910"),
        "Ascend910B" => CardType::Known("Ascend910B"),
        "Ascend910A3" => CardType::Known("Ascend910A3"),
        c if c.starts_with("Ascend910") => CardType::Unknown,
        _ => CardType::Other,
    }
}

fn known_memory_mib(model: &str) -> Option<u64> {
    // An A3 module's 16 NPUs are the 2 dies of each of 8 chips, 64 GiB of HBM each;
    // checked before the first-generation `Ascend910A` prefix it shares.
    if model.starts_with("Ascend910B") || model.starts_with("Ascend910A3") {
        Some(64 * 1024)
    } else if model == "Ascend910" || model.starts_with("Ascend910A") {
        Some(32 * 1024)
    } else if model.starts_with("Ascend310P") {
        Some(24 * 1024)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models() {
        let m = |chip, label, t| refine_model(chip, label, t, None);
        assert_eq!(
            m("Ascend910", Some("910B3"), None).as_deref(),
            Some("Ascend910B3")
        );
        assert_eq!(
            m("Ascend910", Some("Ascend910B4"), None).as_deref(),
            Some("Ascend910B4")
        );
        assert_eq!(
            m("Ascend910", None, Some("module-910b-8")).as_deref(),
            Some("Ascend910B")
        );
        assert_eq!(
            m("Ascend910", None, Some("module")).as_deref(),
            Some("Ascend910")
        );
        assert_eq!(
            m("Ascend310P", Some("910B3"), None).as_deref(),
            Some("Ascend310P")
        );
        // A3 super-pod modules are not first-generation 910 (MindCluster label table).
        assert_eq!(
            m("Ascend910", None, Some("module-a3-16")).as_deref(),
            Some("Ascend910A3")
        );
        assert_eq!(
            m("Ascend910", None, Some("module-a3-16-super-pod")).as_deref(),
            Some("Ascend910A3")
        );
        assert_eq!(
            m("npu", None, Some("950-SuperPod-Atlas-8")).as_deref(),
            Some("Ascend950")
        );
        assert_eq!(m("Ascend910", None, Some("module-z9-64")), None);
        assert_eq!(m("npu", None, None), None);
        // servertype as the device plugin writes it names the card when no
        // accelerator-type does (mind-cluster getNewNodeLabel).
        let s = |st| refine_model("Ascend910", None, None, Some(st));
        assert_eq!(s("Ascend910-32").as_deref(), Some("Ascend910"));
        assert_eq!(s("Ascend910B-20").as_deref(), Some("Ascend910B"));
        assert_eq!(s("Ascend910A3-20").as_deref(), Some("Ascend910A3"));
        assert_eq!(
            s("Ascend910Z-20"),
            None,
            "an unknown card type is not guessed"
        );
        assert_eq!(s("soc").as_deref(), Some("Ascend910"));
        // accelerator-type, the MindCluster table's label, comes first.
        assert_eq!(
            refine_model("Ascend910", None, Some("module"), Some("Ascend910B-20")).as_deref(),
            Some("Ascend910")
        );
    }
}
