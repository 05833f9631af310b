//! The human summary of a plan: class -> flavors -> devices by health -> quota per team.

use std::fmt::Write;

use crate::inventory::Inventory;
use crate::ledger::admission::describe_counts;
use crate::plan::Plan;

pub fn render(plan: &Plan, inventory: &Inventory) -> String {
    let mut s = String::new();
    let devices: u32 = inventory.groups().map(|(_, g)| g.capacity).sum();
    let _ = writeln!(
        s,
        "kaccel plan: {} node(s), {} device(s); {} flavor(s), {} ClusterQueue(s), {} LocalQueue(s)",
        inventory.nodes.len(),
        devices,
        plan.resource_flavors.len(),
        plan.cluster_queues.len(),
        plan.local_queues.len()
    );
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:<22} {:<34} {:>5} {:>7} {:>7} {:>8} {:>6} {:>7} {:>8} {:>7} {:>6}  PER POD",
        "CLASS",
        "FLAVOR (preference order)",
        "NODES",
        "HEALTHY",
        "WARNING",
        "DEGRADED",
        "FAILED",
        "UNKNOWN",
        "CAPACITY",
        "GRANTED",
        "SPARE"
    );
    for (class, report) in &plan.classes {
        if report.flavors.is_empty() {
            let why = report
                .conditions
                .iter()
                .find(|c| c.type_ == "Ready")
                .map(|c| format!("{}: {}", c.reason, c.message))
                .unwrap_or_default();
            let _ = writeln!(s, "{class:<22} -- {why}");
            continue;
        }
        for (i, f) in report.flavors.iter().enumerate() {
            let flavor = &plan.flavors[&f.name];
            let label = if f.demoted {
                format!("{} (demoted)", f.name)
            } else {
                f.name.clone()
            };
            let per_pod = match (i, report.devices_per_pod.as_slice()) {
                (0, []) => "any".to_string(),
                (0, counts) => describe_counts(counts),
                _ => String::new(),
            };
            let _ = writeln!(
                s,
                "{:<22} {:<34} {:>5} {:>7} {:>7} {:>8} {:>6} {:>7} {:>8} {:>7} {:>6}  {}",
                if i == 0 { class.as_str() } else { "" },
                label,
                f.nodes,
                f.devices.healthy,
                f.devices.warning,
                f.devices.degraded,
                f.devices.failed,
                f.devices.unknown,
                flavor.healthy_capacity,
                flavor.granted,
                flavor.spare,
                per_pod
            );
        }
    }
    render_topology(&mut s, plan);
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:<20} {:<20} {:<36} {:>10}",
        "BUDGET", "CLASS", "FLAVOR", "QUOTA"
    );
    for (budget, report) in &plan.budgets {
        if report.grants.is_empty() {
            let _ = writeln!(s, "{budget:<20} (no guaranteed quota)");
        }
        for ((class, flavor), amount) in &report.grants {
            let _ = writeln!(s, "{budget:<20} {class:<20} {flavor:<36} {amount:>10}");
        }
    }
    let unclassified: Vec<_> = inventory.unclassified().collect();
    if !unclassified.is_empty() {
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "Unclassified: {} accelerator device(s) kaccel cannot classify; offered to no class, not CPU-only capacity:",
            inventory.unclassified_device_count()
        );
        for (node, u) in unclassified {
            let _ = writeln!(
                s,
                "  node {}: {} (count {}): {}",
                node.name, u.source, u.count, u.reason
            );
        }
    }
    let problems: Vec<String> = plan
        .classes
        .iter()
        .flat_map(|(n, r)| {
            r.conditions
                .iter()
                .filter(|c| c.status && c.type_ != "Ready")
                .map(move |c| format!("AcceleratorClass {n}: {}: {}", c.type_, c.message))
        })
        .chain(plan.budgets.iter().flat_map(|(n, r)| {
            r.conditions
                .iter()
                .filter(|c| c.status && c.type_ != "Ready")
                .map(move |c| format!("CreditBudget {n}: {}: {}", c.type_, c.message))
        }))
        .collect();
    if !problems.is_empty() {
        let _ = writeln!(s);
        let _ = writeln!(s, "Conditions:");
        for p in problems {
            let _ = writeln!(s, "  {p}");
        }
    }
    // Columns left empty on a class's later rows leave no trailing blanks.
    s.lines()
        .fold(String::with_capacity(s.len()), |mut out, line| {
            out.push_str(line.trim_end());
            out.push('\n');
            out
        })
}

/// The Topology objects, and each class level's blocks per flavor: what one
/// Workload that asks for that level can get at most.
fn render_topology(s: &mut String, plan: &Plan) {
    if plan.topologies.is_empty() {
        return;
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "{:<48} LEVELS (widest first)", "TOPOLOGY");
    for topology in &plan.topologies {
        let levels = topology.level_labels();
        let _ = writeln!(
            s,
            "{:<48} {}",
            topology.metadata.name.as_deref().unwrap_or_default(),
            levels.join(" > ")
        );
    }
    let rows: Vec<(&str, &str, &str, u32, u64)> = plan
        .classes
        .iter()
        .flat_map(|(class, report)| {
            report.flavors.iter().filter_map(move |f| {
                let t = f.topology.as_ref()?;
                Some((
                    class.as_str(),
                    f.name.as_str(),
                    t.level_label.as_deref()?,
                    t.blocks?,
                    t.largest_block?,
                ))
            })
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:<22} {:<34} {:<40} {:>6} {:>8}",
        "CLASS", "FLAVOR", "LEVEL LABEL", "BLOCKS", "LARGEST"
    );
    for (class, flavor, label, blocks, largest) in rows {
        let _ = writeln!(
            s,
            "{class:<22} {flavor:<34} {label:<40} {blocks:>6} {largest:>8}"
        );
    }
}
