//! The query for one source: the series the mapping reads, the PromQL selector and its URL.

use std::fmt::Write as _;

use crate::health::exporters::ExporterKind;

/// One metric-name pattern of an exporter mapping.
#[derive(Clone, Copy, Debug)]
enum Name {
    /// Exactly this name.
    Exact(&'static str),
    /// This prefix and at least one more character.
    Prefix(&'static str),
    /// This prefix and one or more digits.
    Numbered(&'static str),
}

/// The metric names a [`readings`](crate::health::exporters::readings) mapping
/// reads for one exporter kind (see the `fill_*` functions in
/// `src/health/exporters/vendors.rs`; the test
/// `query_selects_everything_the_mapping_reads` keeps the two in step).
struct Names {
    /// The exporter may prefix every name with `<anything>_` (AMD's
    /// `MetricsFieldPrefix`).
    any_prefix: bool,
    names: &'static [Name],
}

fn names(kind: ExporterKind) -> Names {
    use Name::*;
    match kind {
        ExporterKind::DcgmExporter => Names {
            any_prefix: false,
            names: &[
                Exact("DCGM_FI_DEV_GPU_TEMP"),
                Exact("DCGM_FI_DEV_MEMORY_TEMP"),
                Exact("DCGM_FI_DEV_POWER_USAGE"),
                Exact("DCGM_FI_DEV_FB_USED"),
                Exact("DCGM_FI_DEV_GPU_UTIL"),
                Exact("DCGM_FI_DEV_XID_ERRORS"),
                Exact("DCGM_FI_DEV_XID_ERROR"),
                Exact("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),
                Exact("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"),
                Exact("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"),
                Exact("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"),
                Exact("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"),
                Exact("DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL"),
                Exact("DCGM_FI_DEV_ROW_REMAP_FAILURE"),
                Exact("DCGM_FI_DEV_ROW_REMAP_FAILED"),
                Exact("DCGM_FI_DEV_ROW_REMAP_PENDING"),
                Exact("DCGM_FI_DEV_CLOCKS_EVENT_REASONS"),
                Exact("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"),
                Exact("DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION"),
                Exact("DCGM_FI_DEV_GPU_RECOVERY_ACTION"),
                Exact("DCGM_EXP_XID_ERRORS_COUNT"),
            ],
        },
        ExporterKind::AmdDeviceMetrics => Names {
            any_prefix: true,
            names: &[
                Exact("gpu_junction_temperature"),
                Exact("gpu_edge_temperature"),
                Exact("gpu_memory_temperature"),
                Exact("gpu_power_usage"),
                Exact("gpu_package_power"),
                Exact("gpu_average_package_power"),
                Exact("gpu_used_vram"),
                Exact("gpu_gfx_activity"),
                // gpu_ecc_uncorrect_total and the per-block counters.
                Prefix("gpu_ecc_uncorrect_"),
                // gpu_ecc_correct_total and the per-block counters (trend rules).
                Prefix("gpu_ecc_correct_"),
                Exact("gpu_health"),
            ],
        },
        ExporterKind::AscendNpuExporter => Names {
            any_prefix: false,
            names: &[
                Exact("npu_chip_info_temperature"),
                Exact("npu_chip_info_hbm_temperature"),
                Exact("npu_chip_info_power"),
                Exact("npu_chip_info_hbm_used_memory"),
                Exact("npu_chip_info_used_memory"),
                Exact("npu_chip_info_utilization"),
                Exact("npu_chip_info_hbm_ecc_double_bit_error_cnt"),
                Exact("npu_chip_info_hbm_ecc_total_double_bit_error_cnt"),
                Exact("npu_chip_info_hbm_ecc_single_bit_error_cnt"),
                Exact("npu_chip_info_hbm_ecc_total_single_bit_error_cnt"),
                Exact("npu_chip_info_health_status"),
                Exact("npu_chip_info_error_code"),
                Numbered("npu_chip_info_error_code_"),
            ],
        },
        ExporterKind::GaudiExporter => Names {
            any_prefix: false,
            names: &[
                Exact("habanalabs_temperature_onchip"),
                Exact("habanalabs_power_mW"),
                Exact("habanalabs_memory_used_bytes"),
                Exact("habanalabs_utilization"),
                Exact("habanalabs_pending_rows_with_double_bit_ecc_errors"),
            ],
        },
    }
}

impl Name {
    fn matches(self, name: &str) -> bool {
        match self {
            Name::Exact(n) => name == n,
            Name::Prefix(p) => name.len() > p.len() && name.starts_with(p),
            Name::Numbered(p) => name
                .strip_prefix(p)
                .is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit())),
        }
    }

    /// The same pattern as an RE2 regex fragment (metric names need no escaping).
    fn regex(self) -> String {
        match self {
            Name::Exact(n) => n.to_string(),
            Name::Prefix(p) => format!("{p}.+"),
            Name::Numbered(p) => format!("{p}[0-9]+"),
        }
    }
}

/// The `__name__` regex a query for `kind` uses (Prometheus anchors it).
pub fn name_regex(kind: ExporterKind) -> String {
    let n = names(kind);
    let alternatives: Vec<String> = n.names.iter().map(|p| p.regex()).collect();
    if n.any_prefix {
        format!("(.+_)?({})", alternatives.join("|"))
    } else {
        alternatives.join("|")
    }
}

/// Whether the query for `kind` selects a series named `name` (what [`name_regex`]
/// matches, in Rust).
pub fn selects(kind: ExporterKind, name: &str) -> bool {
    let n = names(kind);
    let direct = |s: &str| n.names.iter().any(|p| p.matches(s));
    if direct(name) {
        return true;
    }
    n.any_prefix
        && name
            .match_indices('_')
            .any(|(i, _)| i > 0 && direct(&name[i + 1..]))
}

/// Check a configured selector: empty, or `{matchers}` without a `__name__` matcher
/// (kaccel sets the name). Returns the matchers between the braces.
pub fn selector_matchers(selector: &str) -> Result<&str, String> {
    let s = selector.trim();
    if s.is_empty() {
        return Ok("");
    }
    let inner = s
        .strip_prefix('{')
        .and_then(|r| r.strip_suffix('}'))
        .ok_or_else(|| {
            format!("{selector:?} must be label matchers in braces, e.g. {{job=\"dcgm-exporter\"}}")
        })?;
    if inner.contains("__name__") {
        return Err("must not match __name__: kaccel selects the metric names itself".into());
    }
    if inner.contains(['\n', '\r', '{', '}']) {
        return Err(format!("{selector:?} is not one set of label matchers"));
    }
    Ok(inner.trim().trim_end_matches(',').trim())
}

/// The PromQL expression for one source: the mapping's series under the selector,
/// as a range selector over the staleness window (raw samples, real timestamps).
pub fn query(kind: ExporterKind, selector: &str, window_seconds: i64) -> Result<String, String> {
    let matchers = selector_matchers(selector)?;
    let mut q = format!("{{__name__=~\"{}\"", name_regex(kind));
    if !matchers.is_empty() {
        q.push(',');
        q.push_str(matchers);
    }
    let _ = write!(q, "}}[{}s]", window_seconds.max(1));
    Ok(q)
}

/// `GET` URL of an instant query against a Prometheus base URL
/// (`http://prometheus:9090`, or with a path prefix such as `.../prometheus`).
pub fn query_url(base: &str, query: &str) -> String {
    format!(
        "{}/api/v1/query?query={}",
        base.trim_end_matches('/'),
        percent_encode(query)
    )
}

/// Percent-encode everything but RFC 3986 unreserved characters.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}
