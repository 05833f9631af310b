//! Writing the report: the human table, or the JSON document.

use std::fmt::Write as _;
use std::io::Write;

use super::{InventoryError, InventoryOutput, InventoryReport};
use crate::inventory::{DeviceVariant, NodeInventory};

pub fn write(
    report: &InventoryReport,
    output: InventoryOutput,
    out: &mut impl Write,
) -> Result<(), InventoryError> {
    match output {
        InventoryOutput::Table => write!(out, "{}", render(report))?,
        InventoryOutput::Json => writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(report).expect("the inventory serialises")
        )?,
    }
    Ok(())
}

fn node_state(node: &NodeInventory) -> &'static str {
    match (node.ready, node.unschedulable) {
        (Some(true), false) => "Ready",
        (Some(true), true) => "Ready,Cordoned",
        (Some(false), false) => "NotReady",
        (Some(false), true) => "NotReady,Cordoned",
        (None, false) => "Unknown",
        (None, true) => "Unknown,Cordoned",
    }
}

fn variant_text(v: &DeviceVariant) -> String {
    match &v.partition_profile {
        Some(p) => format!("{} {} {} {p}", v.vendor.as_str(), v.model, v.sharing),
        None => format!("{} {} {}", v.vendor.as_str(), v.model, v.sharing),
    }
}

/// The human table.
pub fn render(report: &InventoryReport) -> String {
    let inv = &report.inventory;
    let mut s = String::new();
    let with_devices = inv.nodes.values().filter(|n| n.has_accelerators()).count();
    let groups = inv.groups().count();
    let devices: u64 = inv.groups().map(|(_, g)| u64::from(g.capacity)).sum();
    let _ = writeln!(
        s,
        "kaccel inventory of {}: {} node(s), {} with accelerators; {} device(s) in {} group(s)",
        report.source,
        inv.nodes.len(),
        with_devices,
        devices,
        groups
    );
    let _ = writeln!(
        s,
        "Health: no health source is read yet; counts follow the Node (withdrawn by the device plugin = DEGRADED, Node not Ready = UNKNOWN)."
    );
    let _ = writeln!(s);
    let mut rows = vec![
        [
            "NODE",
            "STATE",
            "VENDOR",
            "MODEL",
            "SHARING",
            "PROFILE",
            "RESOURCE",
            "CAPACITY",
            "ALLOCATABLE",
            "HEALTHY",
            "WARNING",
            "DEGRADED",
            "FAILED",
            "UNKNOWN",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for (node, group) in inv.groups() {
        let v = &group.variant;
        let h = report
            .health
            .get(&node.name)
            .and_then(|m| m.get(&v.resource_name))
            .copied()
            .unwrap_or_default();
        rows.push(vec![
            node.name.clone(),
            node_state(node).into(),
            v.vendor.as_str().into(),
            v.model.clone(),
            v.sharing.to_string(),
            v.partition_profile.clone().unwrap_or_else(|| "-".into()),
            v.resource_name.clone(),
            group.capacity.to_string(),
            group.allocatable.to_string(),
            h.healthy.to_string(),
            h.warning.to_string(),
            h.degraded.to_string(),
            h.failed.to_string(),
            h.unknown.to_string(),
        ]);
    }
    let unclassified: Vec<_> = inv.unclassified().collect();
    let dra_rows = dra_device_rows(report);
    if rows.len() == 1 && unclassified.is_empty() {
        let _ = writeln!(s, "No accelerators found on any Node.");
    } else if rows.len() == 1 {
        let _ = writeln!(s, "No accelerator kaccel can classify on any Node.");
    } else {
        table(&mut s, &rows, 7);
    }
    if dra_rows.len() > 1 {
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "DRA devices ({}), as their drivers publish them in ResourceSlices; DRIVER, POOL and DEVICE are what a DeviceTaintRule selects:",
            dra_rows.len() - 1
        );
        // No numeric column: all left-aligned.
        table(&mut s, &dra_rows, dra_rows[0].len());
    }
    if !unclassified.is_empty() {
        // The same entries `kaccel plan -o summary` lists and the
        // kaccel_inventory_unclassified_devices metric counts.
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "Unclassified: {} accelerator device(s) kaccel cannot classify; offered to no class, not CPU-only capacity:",
            inv.unclassified_device_count()
        );
        let mut rows = vec![
            [
                "NODE",
                "SOURCE (resource, DRA driver or label)",
                "COUNT",
                "REASON",
            ]
            .map(String::from)
            .to_vec(),
        ];
        for (node, u) in unclassified {
            rows.push(vec![
                node.name.clone(),
                u.source.clone(),
                u.count.to_string(),
                u.reason.clone(),
            ]);
        }
        unclassified_table(&mut s, &rows);
    }

    let _ = writeln!(s);
    let alloc = &report.allocation;
    let _ = writeln!(
        s,
        "Allocated by admitted Kueue Workloads, per ResourceFlavor (Kueue assigns a flavor, not a node; nodes are known only once pods are bound):"
    );
    if let Some(why) = &alloc.unavailable {
        let _ = writeln!(s, "  allocation {why}");
    } else if alloc.flavors.is_empty() {
        let _ = writeln!(
            s,
            "  no ResourceFlavor selects these devices, and no Workload holds any."
        );
    } else {
        let mut rows = vec![
            [
                "FLAVOR",
                "RESOURCE",
                "DEVICES (vendor model sharing profile)",
                "NODES",
                "CAPACITY",
                "ALLOCATABLE",
                "ALLOCATED",
                "WORKLOADS",
            ]
            .map(String::from)
            .to_vec(),
        ];
        for f in &alloc.flavors {
            let variants = if f.variants.is_empty() {
                "(selects no such devices)".to_string()
            } else {
                f.variants
                    .iter()
                    .map(variant_text)
                    .collect::<Vec<_>>()
                    .join("; ")
            };
            rows.push(vec![
                f.flavor.clone(),
                f.resource_name.clone(),
                variants,
                f.nodes.to_string(),
                f.capacity.to_string(),
                f.allocatable.to_string(),
                f.allocated.to_string(),
                f.workloads.to_string(),
            ]);
        }
        table(&mut s, &rows, 3);
    }

    let warnings: Vec<String> = inv
        .nodes
        .values()
        .flat_map(|n| {
            n.warnings
                .iter()
                // Listed under "Unclassified" above.
                .filter(|w| !w.starts_with("unclassified accelerator "))
                .map(move |w| format!("Node {}: {w}", n.name))
        })
        .chain(alloc.warnings.iter().cloned())
        .chain(report.notes.iter().cloned())
        .collect();
    if let Some(h) = &report.device_health {
        // A silent source's devices read e.g. "Failed (last seen T, source stale
        // since T')": the column is as wide as its longest entry.
        let statuses: Vec<String> = h
            .devices
            .iter()
            .map(|v| {
                if v.status_text.is_empty() {
                    format!("{:?}", v.device.status)
                } else {
                    v.status_text.clone()
                }
            })
            .collect();
        let width = widest(&statuses, 9);
        let _ = writeln!(s);
        // Who holds it: namespace/pod, the Workload and team where known.
        let holders: Vec<String> = h
            .devices
            .iter()
            .map(|v| match &v.holder {
                None => "-".to_string(),
                Some(holder) => {
                    let mut text = format!("{}/{}", holder.namespace, holder.pod);
                    if let Some(w) = &holder.workload {
                        text.push_str(&format!(" wl={w}"));
                    }
                    if let Some(t) = &holder.team {
                        text.push_str(&format!(" team={t}"));
                    }
                    text
                }
            })
            .collect();
        let held_width = widest(&holders, 7);
        let _ = writeln!(
            s,
            "{:<20} {:<28} {:<7} {:<width$} {:>6} {:<held_width$} {:<22} REASONS",
            "NODE", "DEVICE", "VENDOR", "STATUS", "TEMP", "HELD BY", "SOURCE"
        );
        for ((view, status), held) in h.devices.iter().zip(&statuses).zip(&holders) {
            let d = &view.device;
            let _ = writeln!(
                s,
                "{:<20} {:<28} {:<7} {:<width$} {:>6} {:<held_width$} {:<22} {}",
                d.node,
                d.reading.uuid.as_deref().unwrap_or(&d.device),
                d.vendor.map(|v| v.as_str()).unwrap_or("-"),
                status,
                d.reading
                    .temperature_c
                    .map(|t| format!("{t:.0}C"))
                    .unwrap_or_else(|| "-".into()),
                held,
                d.source,
                d.reasons.join("; ")
            );
        }
        let _ = writeln!(s);
        let _ = writeln!(s, "{:<32} {:<7} PROBLEM", "HEALTH SOURCE", "USABLE");
        for src in &h.sources {
            let _ = writeln!(
                s,
                "{:<32} {:<7} {}",
                src.name,
                src.usable(h.observed_at),
                src.problem(h.observed_at).unwrap_or_default()
            );
        }
    }
    if !warnings.is_empty() {
        let _ = writeln!(s);
        let _ = writeln!(s, "Notes:");
        for w in warnings {
            let _ = writeln!(s, "  {w}");
        }
    }
    s
}

/// One row per device a DRA driver publishes (header first): its identity, what
/// it says of itself, and whether it is in service.
fn dra_device_rows(report: &InventoryReport) -> Vec<Vec<String>> {
    let mut rows = vec![
        [
            "NODE",
            "DRIVER",
            "POOL",
            "DEVICE",
            "MODEL",
            "UUID",
            "PCI ADDRESS",
            "MEMORY",
            "DRIVER VERSION",
            "IN SERVICE",
            "KACCEL TAINT RULE",
            "HELD BY",
        ]
        .map(String::from)
        .to_vec(),
    ];
    let dash = |v: Option<&str>| v.unwrap_or("-").to_string();
    let rule_of = |d: &crate::inventory::DeviceRecord| {
        report
            .taint_rules
            .iter()
            .find(|r| r.driver == d.driver && r.pool == d.pool && r.device == d.name)
            .map(|r| format!("{} ({}: {})", r.name, r.effect, r.reason))
            .unwrap_or_else(|| "-".into())
    };
    let held_by = |d: &crate::inventory::DeviceRecord| {
        report
            .claimed
            .iter()
            .find(|c| c.id.driver == d.driver && c.id.pool == d.pool && c.id.device == d.name)
            .map(|c| format!("{}/{} (claim {})", c.namespace, c.pods.join(","), c.claim))
            .unwrap_or_else(|| "-".into())
    };
    for (node, group) in report.inventory.groups() {
        for d in group.devices.iter().filter(|d| !d.driver.is_empty()) {
            rows.push(vec![
                node.name.clone(),
                d.driver.to_string(),
                d.pool.clone(),
                d.name.clone(),
                group.variant.model.clone(),
                dash(d.uuid.as_deref()),
                dash(d.pci_address.as_deref()),
                d.memory_mib
                    .map(|m| format!("{m} MiB"))
                    .unwrap_or_else(|| "-".into()),
                dash(d.driver_version.as_deref()),
                match (d.tainted, report.taint_rules.is_empty()) {
                    (true, _) => "no (tainted or unhealthy)".into(),
                    (false, false) if rule_of(d) != "-" => "no (kaccel's taint rule)".into(),
                    _ => "yes".into(),
                },
                rule_of(d),
                held_by(d),
            ]);
        }
    }
    rows
}

/// The width of a column of `texts`, at least `header` wide.
fn widest(texts: &[String], header: usize) -> usize {
    texts
        .iter()
        .map(|t| t.chars().count())
        .max()
        .unwrap_or(0)
        .max(header)
}

/// NODE, SOURCE and COUNT aligned; the (long) reason runs to the end of the line.
fn unclassified_table(s: &mut String, rows: &[Vec<String>]) {
    let width = |c: usize| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0);
    let (w0, w1, w2) = (width(0), width(1), width(2));
    for row in rows {
        let _ = writeln!(
            s,
            "{:<w0$}  {:<w1$}  {:>w2$}  {}",
            row[0], row[1], row[2], row[3]
        );
    }
}

/// Aligned columns; columns from `first_numeric` on are right-aligned.
fn table(s: &mut String, rows: &[Vec<String>], first_numeric: usize) {
    let columns = rows[0].len();
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c > 0 {
                line.push_str("  ");
            }
            if c >= first_numeric {
                let _ = write!(line, "{cell:>w$}", w = widths[c]);
            } else {
                let _ = write!(line, "{cell:<w$}", w = widths[c]);
            }
        }
        let _ = writeln!(s, "{}", line.trim_end());
    }
}
