//! The deployment manifests (manifests/, kustomize) against the code they deploy:
//! RBAC rules pinned exactly (a new API call in the controller fails here until
//! manifests/clusterrole.yaml or role.yaml is changed and reviewed with it), and the
//! Deployment's replicas, probes, ports, identity and config mount.
//!
//! No cluster needed. `kubectl kustomize manifests/` and
//! `kubectl apply --dry-run=server -k manifests/` check the rest against a real API
//! server (see manifests/kustomization.yaml).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use kaccel::controller::Config;
use kaccel::controller::diff::Kind;
use serde_yaml::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every document of a manifest file.
fn docs(file: &str) -> Vec<Value> {
    let path = root().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap_or_else(|e| panic!("{file}: {e}")))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

fn doc(file: &str, kind: &str, name: &str) -> Value {
    docs(file)
        .into_iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{file}: no {kind} {name}"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_sequence()
        .map(|s| {
            s.iter()
                .map(|x| x.as_str().expect("a string").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// (apiGroups, resources, resourceNames, verbs) of each rule, in file order.
type Rule = (Vec<String>, Vec<String>, Vec<String>, Vec<String>);

fn rules(role: &Value) -> Vec<Rule> {
    role["rules"]
        .as_sequence()
        .expect("rules")
        .iter()
        .map(|r| {
            for key in r.as_mapping().expect("rule").keys() {
                let key = key.as_str().unwrap_or_default();
                assert!(
                    ["apiGroups", "resources", "resourceNames", "verbs"].contains(&key),
                    "unexpected rule field {key} (nonResourceURLs?)"
                );
            }
            (
                strings(&r["apiGroups"]),
                strings(&r["resources"]),
                strings(&r["resourceNames"]),
                strings(&r["verbs"]),
            )
        })
        .collect()
}

fn rule(groups: &[&str], resources: &[&str], names: &[&str], verbs: &[&str]) -> Rule {
    let own = |s: &[&str]| s.iter().map(|x| x.to_string()).collect();
    (own(groups), own(resources), own(names), own(verbs))
}

fn config() -> Config {
    Config::load(Some(&root().join("config/kaccel.yaml"))).expect("config/kaccel.yaml loads")
}

#[test]
fn cluster_role_is_exactly_what_the_controller_calls() {
    let config = config();
    let role = doc(
        "manifests/clusterrole.yaml",
        "ClusterRole",
        "kaccel-controller",
    );
    let kueue: Vec<String> = Kind::ALL
        .iter()
        .filter(|k| !matches!(**k, Kind::DeviceClass | Kind::DeviceTaintRule))
        // The plural the controller addresses each kind by (Topology: topologies).
        .map(|k| kaccel::k8s::resources::kueue(k.as_str()).plural)
        .collect();
    let kueue: Vec<&str> = kueue.iter().map(String::as_str).collect();
    let kueue_crds: Vec<&str> = kaccel::kueue::compat::REQUIRED_FIELDS
        .iter()
        .map(|(crd, _)| *crd)
        .collect();
    assert_eq!(
        rules(&role),
        vec![
            // Node watch cache (the inventory).
            rule(&[""], &["nodes"], &[], &["get", "list", "watch", "patch"]),
            // Health sources with `pods:` list the exporter pods each poll; the holder
            // resolver gets the pods exporters attribute devices to.
            rule(&[""], &["pods"], &[], &["get", "list"]),
            // DRA: a list(limit=1) probe, then a watch cache.
            rule(
                &["resource.k8s.io"],
                &["resourceslices"],
                &[],
                &["list", "watch"]
            ),
            // Who holds each DRA device: a watch cache of ResourceClaims.
            rule(
                &["resource.k8s.io"],
                &["resourceclaims"],
                &[],
                &["list", "watch"]
            ),
            // The credit check: the templates of an admitted Workload's claims.
            rule(
                &["resource.k8s.io"],
                &["resourceclaimtemplates"],
                &[],
                &["get"]
            ),
            // The DeviceClasses of DRA-only flavors: owned like the Kueue objects.
            rule(
                &["resource.k8s.io"],
                &["deviceclasses"],
                &[],
                &["get", "list", "watch", "create", "patch", "delete"]
            ),
            // The DeviceTaintRules that take one failed DRA device out.
            rule(
                &["resource.k8s.io"],
                &["devicetaintrules"],
                &[],
                &["get", "list", "watch", "create", "patch", "delete"]
            ),
            // Inputs: watch caches only.
            rule(
                &["kaccel.io"],
                &["acceleratorclasses", "creditbudgets"],
                &[],
                &["list", "watch"]
            ),
            // Status: server-side apply (PATCH) on the status subresource.
            rule(
                &["kaccel.io"],
                &["acceleratorclasses/status", "creditbudgets/status"],
                &[],
                &["patch"]
            ),
            // Owned Kueue objects: watch caches, get before create, SSA (patch, and
            // create when SSA creates), delete orphans and LocalQueue re-creation.
            rule(
                &["kueue.x-k8s.io"],
                &kueue,
                &[],
                &["get", "list", "watch", "create", "patch", "delete"]
            ),
            // evictWorkloadsOnFailed: deactivate / reactivate Workloads on a cordoned
            // node; the credit ledger: watch Workloads, SSA of its finalizer + record,
            // get one before closing a reservation the cache says is orphaned.
            rule(
                &["kueue.x-k8s.io"],
                &["workloads"],
                &[],
                &["get", "list", "watch", "patch"]
            ),
            // The credit check's state on each Workload.
            rule(&["kueue.x-k8s.io"], &["workloads/status"], &[], &["patch"]),
            // The ledger's AdmissionCheck and its Active condition (SSA).
            rule(
                &["kueue.x-k8s.io"],
                &["admissionchecks"],
                &[],
                &["create", "patch"]
            ),
            rule(
                &["kueue.x-k8s.io"],
                &["admissionchecks/status"],
                &[],
                &["patch"]
            ),
            // MultiKueue: the workers' MultiKueueClusters (SSA, and deletion of
            // those no longer configured) and the MultiKueueConfig listing them.
            rule(
                &["kueue.x-k8s.io"],
                &["multikueueclusters"],
                &[],
                &["list", "create", "patch", "delete"]
            ),
            rule(
                &["kueue.x-k8s.io"],
                &["multikueueconfigs"],
                &[],
                &["create", "patch"]
            ),
            // Events, in the namespace of the object they are about: "default"
            // for cluster-scoped objects, each team's for its Workloads.
            rule(&["events.k8s.io"], &["events"], &[], &["create", "patch"]),
            // The pod webhook's CA bundle, in its own configuration only.
            rule(
                &["admissionregistration.k8s.io"],
                &["mutatingwebhookconfigurations"],
                &[config.webhook.configuration_name.as_str()],
                &["get", "patch"]
            ),
            // The start-up check of Kueue's schema: the CRDs it reads, by name.
            rule(
                &["apiextensions.k8s.io"],
                &["customresourcedefinitions"],
                &kueue_crds,
                &["get"]
            ),
        ],
        "manifests/clusterrole.yaml changed, or the controller's Kueue kinds did: review both"
    );
}

#[test]
fn namespaced_roles_cover_the_lease_the_webhook_certificate_and_kueue_config_only() {
    let config = config();
    let lease = doc("manifests/role.yaml", "Role", "kaccel-leader-election");
    assert_eq!(
        lease["metadata"]["namespace"],
        config.leader_election.lease_namespace.as_str(),
        "the Lease Role must live where the Lease does (POD_NAMESPACE in the Deployment)"
    );
    assert_eq!(
        rules(&lease),
        vec![
            // kube-lease-manager creates the Lease when missing (create cannot be
            // narrowed to a name) ...
            rule(&["coordination.k8s.io"], &["leases"], &[], &["create"]),
            // ... reads it, and takes/renews/releases it with PATCH. No update.
            rule(
                &["coordination.k8s.io"],
                &["leases"],
                &[config.leader_election.lease_name.as_str()],
                &["get", "patch"]
            ),
        ]
    );
    assert!(
        docs("manifests/role.yaml")
            .iter()
            .all(|d| d["metadata"]["name"] != "kaccel-events"),
        "Events are in the ClusterRole: kaccel reports on Workloads in every team's namespace"
    );
    // The pod webhook's generated certificate: the one Secret webhook.secret names.
    let certificate = doc("manifests/role.yaml", "Role", "kaccel-webhook-certificate");
    let (namespace, name) = config.webhook.secret_ref().expect("NAMESPACE/NAME");
    assert_eq!(certificate["metadata"]["namespace"], namespace);
    assert_eq!(
        rules(&certificate),
        vec![
            rule(&[""], &["secrets"], &[], &["create"]),
            rule(&[""], &["secrets"], &[name], &["get"]),
        ]
    );
    // Kueue's Configuration: the one ConfigMap kueue.configMap names, read only.
    let kueue_config = doc("manifests/role.yaml", "Role", "kaccel-read-kueue-config");
    let (namespace, name) = config
        .kueue
        .config_map_ref()
        .expect("the default config reads Kueue's ConfigMap");
    assert_eq!(kueue_config["metadata"]["namespace"], namespace);
    assert_eq!(
        rules(&kueue_config),
        vec![rule(
            &[""],
            &["configmaps"],
            &[name],
            &["get", "list", "watch"]
        )]
    );
}

/// MultiKueue's optional Role (manifests/multikueue/): `get` on the named
/// kubeconfig Secrets in Kueue's namespace, nothing else, bound to kaccel.
#[test]
fn the_multikueue_role_reads_only_the_named_worker_kubeconfigs() {
    let config = config();
    let file = "manifests/multikueue/worker-kubeconfigs.yaml";
    let role = doc(file, "Role", "kaccel-read-worker-kubeconfigs");
    assert_eq!(
        role["metadata"]["namespace"],
        config.multi_kueue.kueue_namespace.as_str()
    );
    assert_eq!(
        rules(&role),
        vec![rule(
            &[""],
            &["secrets"],
            &["worker-eu-1-kubeconfig"],
            &["get"]
        )]
    );
    let binding = doc(file, "RoleBinding", "kaccel-read-worker-kubeconfigs");
    assert_eq!(
        binding["metadata"]["namespace"],
        role["metadata"]["namespace"]
    );
    assert_eq!(binding["roleRef"]["name"], "kaccel-read-worker-kubeconfigs");
    assert_eq!(binding["subjects"][0]["name"], "kaccel");
    assert_eq!(binding["subjects"][0]["namespace"], "kaccel-system");
}

#[test]
fn bindings_give_the_roles_to_the_controller_service_account() {
    let sa = doc("manifests/serviceaccount.yaml", "ServiceAccount", "kaccel");
    let ns = sa["metadata"]["namespace"].as_str().unwrap();
    let deployment = doc(
        "manifests/deployment.yaml",
        "Deployment",
        "kaccel-controller",
    );
    assert_eq!(
        deployment["spec"]["template"]["spec"]["serviceAccountName"],
        "kaccel"
    );
    assert_eq!(deployment["metadata"]["namespace"], ns);
    let mut bindings = docs("manifests/rolebinding.yaml");
    bindings.extend(docs("manifests/clusterrolebinding.yaml"));
    let bound: BTreeSet<(String, String)> = bindings
        .iter()
        .map(|b| {
            let subjects = b["subjects"].as_sequence().expect("subjects");
            assert_eq!(subjects.len(), 1, "{b:?}");
            assert_eq!(subjects[0]["kind"], "ServiceAccount");
            assert_eq!(subjects[0]["name"], "kaccel");
            assert_eq!(subjects[0]["namespace"], ns);
            if b["kind"] == "RoleBinding" {
                assert_eq!(b["roleRef"]["kind"], "Role");
            }
            (
                b["roleRef"]["kind"].as_str().unwrap().to_string(),
                b["roleRef"]["name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected: BTreeSet<(String, String)> = [
        ("ClusterRole", "kaccel-controller"),
        ("Role", "kaccel-leader-election"),
        ("Role", "kaccel-read-kueue-config"),
        ("Role", "kaccel-webhook-certificate"),
    ]
    .iter()
    .map(|(k, n)| (k.to_string(), n.to_string()))
    .collect();
    assert_eq!(bound, expected);
    for b in docs("manifests/rolebinding.yaml") {
        let role = doc(
            "manifests/role.yaml",
            "Role",
            b["roleRef"]["name"].as_str().unwrap(),
        );
        assert_eq!(
            b["metadata"]["namespace"], role["metadata"]["namespace"],
            "a RoleBinding must be in its Role's namespace"
        );
    }
}

/// Kubernetes API calls in src/controller, by the kube `Api` method (or helper)
/// that makes them. A method not listed here fails the test: add its verb to the
/// RBAC manifests (and the expectations above), then here.
#[test]
fn controller_calls_only_reviewed_api_methods() {
    // method -> the RBAC verbs it needs (documentation; pinned in the tests above).
    let reviewed = [
        (".list(", "list"),
        ("watcher(", "list, watch"),
        (".get_opt(", "get"),
        (
            "api.get(",
            "get (a Node before patching it; the pod webhook's Workload)",
        ),
        (
            ".patch(",
            "patch (and create: server-side apply may create)",
        ),
        (".patch_status(", "patch on the status subresource"),
        (".delete(", "delete"),
        (
            ".create(",
            "create (the pod webhook's certificate Secret, when none exists yet)",
        ),
    ];
    let watched = [
        ".replace(",
        ".replace_status(",
        ".get_status(",
        ".get_metadata(",
        ".list_metadata(",
        ".delete_collection(",
        ".evict(",
        ".patch_metadata(",
        ".patch_subresource(",
        ".create_subresource(",
        ".replace_subresource(",
        "metadata_watcher(",
    ];
    let mut used = BTreeSet::new();
    let dir = root().join("src/controller");
    for entry in std::fs::read_dir(&dir).expect("src/controller") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("source");
        for (method, _) in reviewed {
            if contains_call(&text, method) {
                used.insert(method);
            }
        }
        for method in watched {
            assert!(
                !contains_call(&text, method),
                "{}: calls {method}: add the RBAC verb it needs to manifests/ and to tests/manifests.rs",
                path.display()
            );
        }
    }
    let all: BTreeSet<&str> = reviewed.iter().map(|(m, _)| *m).collect();
    assert_eq!(
        used, all,
        "an API method is no longer used: drop its verb from manifests/ and here"
    );
}

/// `method` occurs as a call (not as the tail of a longer name, e.g.
/// `metadata_watcher(` for `watcher(`).
fn contains_call(text: &str, method: &str) -> bool {
    text.match_indices(method).any(|(i, _)| {
        method.starts_with('.')
            || !text[..i]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

fn container(deployment: &Value) -> &Value {
    let containers = deployment["spec"]["template"]["spec"]["containers"]
        .as_sequence()
        .expect("containers");
    assert_eq!(containers.len(), 1);
    &containers[0]
}

#[test]
fn deployment_runs_two_replicas_with_probes_on_the_http_server() {
    let d = doc(
        "manifests/deployment.yaml",
        "Deployment",
        "kaccel-controller",
    );
    assert_eq!(d["spec"]["replicas"], 2, "one leader, one warm standby");
    let c = container(&d);
    let port = config().http_address.port();
    let ports = c["ports"].as_sequence().expect("ports");
    assert_eq!(ports[0]["containerPort"], u64::from(port));
    assert_eq!(ports[0]["name"], "http");
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe}");
        assert_eq!(get["port"], "http", "{probe}");
    }
    // The Service scrapes the same port.
    let svc = doc("manifests/service.yaml", "Service", "kaccel-metrics");
    assert_eq!(svc["spec"]["ports"][0]["port"], u64::from(port));
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "http");
    assert_eq!(
        svc["spec"]["selector"],
        d["spec"]["template"]["metadata"]["labels"]
    );
    // Replicas spread over nodes.
    let anti = &d["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"];
    let term = &anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"];
    assert_eq!(term["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(
        term["labelSelector"]["matchLabels"],
        d["spec"]["selector"]["matchLabels"]
    );
}

#[test]
fn deployment_identity_config_and_security_context() {
    let d = doc(
        "manifests/deployment.yaml",
        "Deployment",
        "kaccel-controller",
    );
    let c = container(&d);
    // Leader-election identity and Lease namespace from the downward API.
    let env = c["env"].as_sequence().expect("env");
    for (name, field) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
    ] {
        let var = env
            .iter()
            .find(|e| e["name"] == name)
            .unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(var["valueFrom"]["fieldRef"]["fieldPath"], field);
    }
    let log_format = env
        .iter()
        .find(|e| e["name"] == "KACCEL_LOG_FORMAT")
        .expect("KACCEL_LOG_FORMAT set");
    assert_eq!(
        log_format["value"], "json",
        "structured logs in the cluster"
    );
    // The config file: from the ConfigMap kustomize generates out of config/kaccel.yaml.
    // ... and the pod webhook on (manifests/webhook.yaml registers it).
    let args = strings(&c["args"]);
    assert_eq!(
        args,
        ["run", "--config", "/etc/kaccel/kaccel.yaml", "--webhook"]
    );
    let mount = &c["volumeMounts"][0];
    assert_eq!(mount["mountPath"], "/etc/kaccel");
    let volume = &d["spec"]["template"]["spec"]["volumes"][0];
    assert_eq!(volume["name"], mount["name"]);
    assert_eq!(volume["configMap"]["name"], "kaccel-config");
    let generator = &docs("config/kustomization.yaml")[0]["configMapGenerator"][0];
    assert_eq!(generator["name"], "kaccel-config");
    assert_eq!(strings(&generator["files"]), ["kaccel.yaml"]);
    // Hardened.
    let sc = &c["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"]);
    assert_eq!(
        d["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"],
        true
    );
    for kind in ["requests", "limits"] {
        for resource in ["cpu", "memory"] {
            assert!(
                c["resources"][kind][resource].is_string(),
                "resources.{kind}.{resource} missing"
            );
        }
    }
}

#[test]
fn kustomization_lists_every_manifest() {
    let k = &docs("manifests/kustomization.yaml")[0];
    let listed: BTreeSet<String> = strings(&k["resources"]).into_iter().collect();
    let dir = root().join("manifests");
    for entry in std::fs::read_dir(&dir).expect("manifests/") {
        let name = entry.expect("entry").file_name().into_string().unwrap();
        if name.ends_with(".yaml") && name != "kustomization.yaml" {
            assert!(
                listed.contains(&name),
                "manifests/{name} is not in kustomization.yaml"
            );
        }
    }
    for folder in ["../crds", "../config"] {
        assert!(listed.contains(folder), "{folder} missing");
    }
    // crds/Kustomization lists every committed CRD (and is not a .yaml file, so
    // `kubectl apply -f crds/` in e2e/cluster.sh does not trip over it).
    let crds = &docs("crds/Kustomization")[0];
    let listed: BTreeSet<String> = strings(&crds["resources"]).into_iter().collect();
    let on_disk: BTreeSet<String> = std::fs::read_dir(root().join("crds"))
        .expect("crds/")
        .map(|e| e.expect("entry").file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    assert_eq!(listed, on_disk);
    assert!(!Path::new(&root().join("crds/kustomization.yaml")).exists());
}

/// The pod webhook as registered: the Service reaches the container's webhook
/// port, the configuration's name and path are the ones kaccel writes and serves,
/// it fails closed, and only pods asking for kaccel.io/accelerator are sent.
#[test]
fn the_pod_webhook_is_wired_to_what_kaccel_serves() {
    let config = config();
    let service = doc("manifests/webhook.yaml", "Service", "kaccel-webhook");
    let deployment = doc(
        "manifests/deployment.yaml",
        "Deployment",
        "kaccel-controller",
    );
    let c = &deployment["spec"]["template"]["spec"]["containers"][0];
    let port = c["ports"]
        .as_sequence()
        .expect("ports")
        .iter()
        .find(|p| p["name"] == "webhook")
        .expect("a webhook port");
    assert_eq!(
        port["containerPort"].as_u64(),
        Some(u64::from(config.webhook.address.port()))
    );
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "webhook");
    assert_eq!(service["spec"]["ports"][0]["port"].as_u64(), Some(443));
    let host = format!(
        "{}.{}.svc",
        service["metadata"]["name"].as_str().unwrap(),
        service["metadata"]["namespace"].as_str().unwrap()
    );
    assert!(
        config.webhook.hosts.contains(&host),
        "the generated certificate must name {host}"
    );
    let mwc = doc(
        "manifests/webhook.yaml",
        "MutatingWebhookConfiguration",
        &config.webhook.configuration_name,
    );
    let hook = &mwc["webhooks"][0];
    assert_eq!(hook["failurePolicy"], "Fail");
    assert_eq!(hook["sideEffects"], "None");
    assert_eq!(
        hook["clientConfig"]["service"]["name"],
        service["metadata"]["name"]
    );
    assert_eq!(hook["clientConfig"]["service"]["path"], "/mutate-pods");
    assert_eq!(strings(&hook["rules"][0]["operations"]), ["CREATE"]);
    assert_eq!(strings(&hook["rules"][0]["resources"]), ["pods"]);
    let condition = hook["matchConditions"][0]["expression"].as_str().unwrap();
    assert!(condition.contains("'kaccel.io/accelerator' in c.resources.limits"));
    assert!(condition.contains("initContainers"));

    // The Workload hook: new Workloads to kaccel's /mutate-workloads, never
    // refused or held up when kaccel does not answer (the check writes the
    // finalizer itself then).
    let hook = &mwc["webhooks"][1];
    assert_eq!(hook["name"], "workloads.credits.kaccel.io");
    assert_eq!(hook["failurePolicy"], "Ignore");
    assert_eq!(hook["sideEffects"], "None");
    assert_eq!(
        hook["clientConfig"]["service"]["name"],
        service["metadata"]["name"]
    );
    assert_eq!(hook["clientConfig"]["service"]["path"], "/mutate-workloads");
    assert_eq!(strings(&hook["rules"][0]["apiGroups"]), ["kueue.x-k8s.io"]);
    assert_eq!(strings(&hook["rules"][0]["operations"]), ["CREATE"]);
    assert_eq!(strings(&hook["rules"][0]["resources"]), ["workloads"]);
    assert!(
        hook["timeoutSeconds"].as_u64().is_some_and(|t| t <= 5),
        "a Workload's creation waits at most this long for kaccel"
    );
    assert_eq!(mwc["webhooks"].as_sequence().map(Vec::len), Some(2));
}
