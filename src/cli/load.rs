//! Reading AcceleratorClass / CreditBudget / Node / ResourceSlice YAML from files and
//! folders, with errors that name the file, the object and the field.
//!
//! Nodes and DRA ResourceSlices (`resource.k8s.io/v1`) are read as `kubectl get -o
//! yaml` prints them: one object per document, or a `List` (`v1 List`, `NodeList`,
//! `ResourceSliceList`) of them. The plan and inventory commands merge the slices into
//! the Nodes with [`crate::inventory::Inventory::from_nodes_and_slices`], the function
//! the controller uses, so both read a fleet the same way.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use serde::Deserialize;

use crate::api::{AcceleratorClass, CreditBudget};
use crate::plan::{validate_budget, validate_class};

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: document {index}: not valid YAML: {message}")]
    Yaml {
        path: PathBuf,
        index: usize,
        message: String,
    },
    #[error("{path}: {kind} {name:?}: {message}")]
    Object {
        path: PathBuf,
        kind: String,
        name: String,
        message: String,
    },
    #[error("{0}: no .yaml or .yml files found")]
    Empty(PathBuf),
}

/// Everything read from the inputs, in file order.
#[derive(Default, Debug)]
pub struct Loaded {
    pub classes: Vec<AcceleratorClass>,
    pub budgets: Vec<CreditBudget>,
    pub nodes: Vec<Node>,
    /// DRA ResourceSlices (`resource.k8s.io/v1`).
    pub slices: Vec<ResourceSlice>,
    /// Documents of other kinds, skipped (file, kind) — e.g. example Workloads.
    pub skipped: Vec<(PathBuf, String)>,
}

/// Files under the given paths: files as given, folders searched recursively for
/// `.yaml`/`.yml`, sorted so the result does not depend on the file system.
pub fn yaml_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, LoadError> {
    let mut out = Vec::new();
    for path in paths {
        if path.is_dir() {
            let before = out.len();
            walk(path, &mut out)?;
            if out.len() == before {
                return Err(LoadError::Empty(path.clone()));
            }
        } else {
            out.push(path.clone());
        }
    }
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), LoadError> {
    let read = |e| LoadError::Read {
        path: dir.to_path_buf(),
        source: e,
    };
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(read)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(read)?;
    entries.sort();
    for p in entries {
        if p.is_dir() {
            walk(&p, out)?;
        } else if matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")) {
            out.push(p);
        }
    }
    Ok(())
}

/// Load and validate every document. All errors are collected, so one run shows
/// every problem; any error means nothing is returned.
pub fn load(paths: &[PathBuf]) -> Result<Loaded, Vec<LoadError>> {
    let files = yaml_files(paths).map_err(|e| vec![e])?;
    let mut loaded = Loaded::default();
    let mut errors = Vec::new();
    for path in files {
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(source) => {
                errors.push(LoadError::Read { path, source });
                continue;
            }
        };
        load_text(&path, &text, &mut loaded, &mut errors);
    }
    if errors.is_empty() {
        Ok(loaded)
    } else {
        Err(errors)
    }
}

pub fn load_text(path: &Path, text: &str, loaded: &mut Loaded, errors: &mut Vec<LoadError>) {
    for (index, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = match serde_yaml::Value::deserialize(doc) {
            Ok(serde_yaml::Value::Null) => continue,
            Ok(v) => v,
            Err(e) => {
                errors.push(LoadError::Yaml {
                    path: path.to_path_buf(),
                    index: index + 1,
                    message: e.to_string(),
                });
                // A syntax error ends the stream; later documents cannot be trusted.
                return;
            }
        };
        load_value(path, value, None, loaded, errors);
    }
}

/// Lists whose items may omit `apiVersion`/`kind` (typed lists from the API): the
/// item's (apiVersion, kind).
fn typed_list_item(api_version: &str, kind: &str) -> Option<(&'static str, &'static str)> {
    match (api_version, kind) {
        ("v1", "NodeList") => Some(("v1", "Node")),
        ("resource.k8s.io/v1", "ResourceSliceList") => {
            Some(("resource.k8s.io/v1", "ResourceSlice"))
        }
        _ => None,
    }
}

/// Read one object (or the items of a list). `item_of`: the (apiVersion, kind) a
/// typed list's items have when they do not say.
fn load_value(
    path: &Path,
    value: serde_yaml::Value,
    item_of: Option<(&str, &str)>,
    loaded: &mut Loaded,
    errors: &mut Vec<LoadError>,
) {
    let field = |key: &str| value.get(key).and_then(|k| k.as_str()).map(str::to_string);
    let (api_version, kind) = match (field("apiVersion"), field("kind"), item_of) {
        (None, None, Some((v, k))) => (v.to_string(), k.to_string()),
        (v, k, _) => (v.unwrap_or_default(), k.unwrap_or_default()),
    };
    let name = value
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(|n| n.as_str())
        .unwrap_or("<unnamed>")
        .to_string();
    let object_error = |message: String| LoadError::Object {
        path: path.to_path_buf(),
        kind: kind.clone(),
        name: name.clone(),
        message,
    };
    let typed_item = typed_list_item(&api_version, &kind);
    match (api_version.as_str(), kind.as_str()) {
        ("kaccel.io/v1alpha1", "AcceleratorClass") => {
            match serde_yaml::from_value::<AcceleratorClass>(value) {
                Ok(class) => {
                    let problems = class_problems(&class);
                    if problems.is_empty() {
                        loaded.classes.push(class);
                    } else {
                        errors.extend(problems.into_iter().map(object_error));
                    }
                }
                Err(e) => errors.push(object_error(e.to_string())),
            }
        }
        ("kaccel.io/v1alpha1", "CreditBudget") => {
            match serde_yaml::from_value::<CreditBudget>(value) {
                Ok(budget) => {
                    let problems = budget_problems(&budget);
                    if problems.is_empty() {
                        loaded.budgets.push(budget);
                    } else {
                        errors.extend(problems.into_iter().map(object_error));
                    }
                }
                Err(e) => errors.push(object_error(e.to_string())),
            }
        }
        ("v1", "Node") => match serde_yaml::from_value::<Node>(value) {
            Ok(node) => loaded.nodes.push(node),
            Err(e) => errors.push(object_error(e.to_string())),
        },
        ("resource.k8s.io/v1", "ResourceSlice") => {
            match serde_yaml::from_value::<ResourceSlice>(value) {
                Ok(slice) => loaded.slices.push(slice),
                Err(e) => errors.push(object_error(e.to_string())),
            }
        }
        (v, "ResourceSlice") if v.starts_with("resource.k8s.io/") => {
            errors.push(object_error(format!(
                "apiVersion {v}: kaccel reads ResourceSlices of resource.k8s.io/v1 (Kubernetes 1.34+), whose device fields differ from {v}'s; export them as v1 (kubectl get resourceslices.v1.resource.k8s.io -o yaml)"
            )))
        }
        (_, "List") | (_, "NodeList") | (_, "ResourceSliceList") => {
            let items = match value.get("items") {
                None | Some(serde_yaml::Value::Null) => return,
                Some(serde_yaml::Value::Sequence(items)) => items.clone(),
                Some(_) => {
                    errors.push(object_error(
                        "items: expected a list of objects (as kubectl get -o yaml prints)".into(),
                    ));
                    return;
                }
            };
            for item in items {
                load_value(path, item, typed_item, loaded, errors);
            }
        }
        (_, "") => errors.push(object_error(
            "has no kind: every document needs apiVersion and kind".into(),
        )),
        (v, k) if v.starts_with("kaccel.io/") => errors.push(object_error(format!(
            "unknown kaccel kind {k} in {v}: expected kaccel.io/v1alpha1 AcceleratorClass or CreditBudget"
        ))),
        _ => loaded.skipped.push((path.to_path_buf(), kind.clone())),
    }
}

/// The API server's CEL rules, evaluated here, plus the planner's own checks.
fn class_problems(class: &AcceleratorClass) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    if let Err(e) = class.validate_cel() {
        out.extend(cel_messages(&e));
    }
    for e in validate_class(&class.spec) {
        let s = e.to_string();
        if !out.iter().any(|o| o.contains(&e.message)) {
            out.push(s);
        }
    }
    out
}

fn budget_problems(budget: &CreditBudget) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    if let Err(e) = budget.validate_cel() {
        out.extend(cel_messages(&e));
    }
    for e in validate_budget(&budget.spec) {
        if !out.iter().any(|o| o.contains(&e.message)) {
            out.push(e.to_string());
        }
    }
    out
}

fn cel_messages(e: &impl std::fmt::Display) -> Vec<String> {
    e.to_string()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}
