//! The webhooks' I/O: HTTPS on `webhook.address`, served by every replica
//! (leader or not), answering the API server's AdmissionReviews for pods with
//! [`crate::webhook`]'s rewrite (`/mutate-pods`), and for new Workloads with the
//! credit check's finalizer ([`crate::webhook::finalizer`], `/mutate-workloads`,
//! while the ledger is on).
//!
//! Where the pod was placed comes from Kueue: the pod's `kueue.x-k8s.io/workload`
//! annotation and `kueue.x-k8s.io/podset` label (Kueue puts both on the pod
//! template it admits) name the Workload, whose admission says which flavor the
//! class resource was assigned; kaccel's ResourceFlavor says which vendor
//! resource that flavor's devices are; the ClusterQueue's class label and the
//! class give the vendor's pod settings. Placements come from a watch of the
//! Workloads, used only when the cached flavor agrees with the nodeSelector Kueue
//! wrote into the pod; a miss or a disagreement (a pod created before the watch
//! saw its admission, a re-admission elsewhere) reads the Workload from the API
//! server, so a pod is never placed from a stale cache.
//!
//! Certificates: from `webhook.certDir` (cert-manager), or generated once into a
//! Secret every replica shares, its CA written into the
//! MutatingWebhookConfiguration's `caBundle` (and rewritten should it drift).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use super::config::Webhook;
use super::metrics::{AnswerLabel, Metrics};
use super::{Error, api_err};
use crate::api::{self, AcceleratorClass, Vendor};
use crate::k8s::instance;
use crate::k8s::labels::{
    CLASS_LABEL, DEVICE_RESOURCE_ANNOTATION, MANAGED_BY_LABEL, MODEL_ANNOTATION, VENDOR_ANNOTATION,
};
use crate::kueue::workload::Workload;
use crate::kueue::{ClusterQueue, LocalQueue, ResourceFlavor};
use crate::webhook::{
    Answer, Placement, asks_for_class_resource, finalizer, review_response, rewrite, settings_for,
};

/// Kueue's annotation naming a pod's Workload, and label naming its podSet.
const WORKLOAD_ANNOTATION: &str = "kueue.x-k8s.io/workload";
const POD_SET_LABEL: &str = "kueue.x-k8s.io/podset";
const LOCAL_QUEUE_LABEL: &str = "kueue.x-k8s.io/local-queue-name";

/// The PEM a webhook serves with, and the CA that signed it.
struct TlsMaterial {
    cert: String,
    key: String,
    /// `None` when the certificate comes from `certDir` (cert-manager injects it).
    ca: Option<String>,
}

/// Where Kueue placed the class resource of each admitted Workload: (namespace,
/// name) -> (ClusterQueue, podSet -> flavor). Only Workloads holding the class
/// resource are kept, so the map is as large as the class-level work admitted.
type Placements = Arc<std::sync::RwLock<HashMap<(String, String), Placed>>>;

#[derive(Clone, Debug, PartialEq, Eq)]
struct Placed {
    cluster_queue: String,
    flavors: BTreeMap<String, String>,
}

impl Placed {
    /// The placement of `w`'s class resource, if Kueue assigned it a flavor.
    fn of(w: &Workload) -> Option<Placed> {
        let admission = w.status.admission.as_ref()?;
        let flavors: BTreeMap<String, String> = admission
            .pod_set_assignments
            .iter()
            .filter_map(|p| {
                let flavor = p.flavors.as_ref()?.get(api::CLASS_RESOURCE)?;
                Some((
                    p.name.clone().unwrap_or_else(|| "main".into()),
                    flavor.clone(),
                ))
            })
            .collect();
        (!flavors.is_empty()).then(|| Placed {
            cluster_queue: admission.cluster_queue.clone(),
            flavors,
        })
    }
}

#[derive(Clone)]
struct WebhookState {
    client: Client,
    placements: Placements,
    flavors: Store<ResourceFlavor>,
    queues: Store<ClusterQueue>,
    classes: Store<AcceleratorClass>,
    /// This installation (config `instance`): the queues whose pods it places.
    instance: String,
    metrics: Metrics,
    /// The credit check's finalizer and check name, with a cache of every
    /// LocalQueue: while the ledger is on, new Workloads bound for a queue that
    /// carries the check get the finalizer as they are created.
    credits: Option<(CreditsHook, Store<LocalQueue>)>,
}

/// What the Workload webhook needs of the credit check.
#[derive(Clone, Debug)]
pub(super) struct CreditsHook {
    /// The finalizer on a Workload this installation charges.
    pub(super) finalizer: String,
    /// The AdmissionCheck its ClusterQueues carry.
    pub(super) check: String,
}

/// Serves the webhook until `shutdown`.
pub(super) async fn serve(
    client: Client,
    config: Webhook,
    instance: String,
    metrics: Metrics,
    credits: Option<CreditsHook>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let tls = if config.cert_dir.is_empty() {
        generated_certificate(&client, &config, &instance).await?
    } else {
        let read = |file: &str| {
            let path = std::path::Path::new(&config.cert_dir).join(file);
            std::fs::read_to_string(&path)
                .map_err(|e| Error::Webhook(format!("cannot read {}: {e}", path.display())))
        };
        TlsMaterial {
            cert: read("tls.crt")?,
            key: read("tls.key")?,
            ca: None,
        }
    };
    if let Some(ca) = tls.ca.clone() {
        tokio::spawn(keep_ca_bundle(
            client.clone(),
            config.configuration_name.clone(),
            ca,
        ));
    }
    let acceptor = tls_acceptor(&tls)?;
    let managed = watcher::Config::default().labels(&instance::managed_selector(&instance));
    let state = WebhookState {
        placements: watch_placements(client.clone()),
        flavors: cache(Api::all(client.clone()), managed),
        // Every ClusterQueue, not only this installation's: a pod of another
        // kaccel installation's queue is that installation's webhook's to place.
        queues: cache(Api::all(client.clone()), watcher::Config::default()),
        classes: cache(Api::all(client.clone()), watcher::Config::default()),
        // Every LocalQueue: one a team made by hand may point at kaccel's
        // ClusterQueue too.
        credits: credits.map(|hook| {
            let queues = cache(Api::all(client.clone()), watcher::Config::default());
            (hook, queues)
        }),
        client,
        instance,
        metrics,
    };
    let app = Router::new()
        .route("/mutate-pods", post(mutate))
        .route("/mutate-workloads", post(mutate_workload))
        .with_state(state);
    let address = config.address;
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|source| Error::Http { address, source })?;
    tracing::info!(%address, "serving the webhooks (HTTPS /mutate-pods, /mutate-workloads)");
    axum::serve(TlsListener { listener, acceptor }, app)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|source| Error::Http { address, source })
}

/// A watch cache driven by a task of its own.
fn cache<K>(api: Api<K>, config: watcher::Config) -> Store<K>
where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let writer = reflector::store::Writer::default();
    let store = writer.as_reader();
    let stream = watcher(api, config)
        .backoff(super::watches::WatchBackoff::default())
        .modify(|o: &mut K| o.meta_mut().managed_fields = None)
        .reflect(writer);
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            if let Err(e) = event {
                tracing::warn!(error = %e, "pod webhook watch error (retrying)");
            }
        }
    });
    store
}

/// Keeps [`Placements`] from a watch of every Workload (each deserialised into
/// the slim typed form and dropped at once; only placements are kept).
fn watch_placements(client: Client) -> Placements {
    let placements = Placements::default();
    let map = placements.clone();
    let api: Api<Workload> = Api::all(client);
    tokio::spawn(async move {
        let stream = watcher(api, watcher::Config::default())
            .backoff(super::watches::WatchBackoff::default());
        futures::pin_mut!(stream);
        // Filled anew on each (re)list, swapped in when the list is complete.
        let mut relisted: Option<HashMap<(String, String), Placed>> = None;
        while let Some(event) = stream.next().await {
            let event = match event {
                Ok(event) => event,
                Err(e) => {
                    tracing::warn!(error = %e, "pod webhook Workload watch error (retrying)");
                    continue;
                }
            };
            let key = |w: &Workload| (w.namespace().unwrap_or_default(), w.name_any());
            match event {
                watcher::Event::Init => relisted = Some(HashMap::new()),
                watcher::Event::InitApply(w) => {
                    if let (Some(fresh), Some(placed)) = (relisted.as_mut(), Placed::of(&w)) {
                        fresh.insert(key(&w), placed);
                    }
                }
                watcher::Event::InitDone => {
                    if let Some(fresh) = relisted.take() {
                        *map.write().expect("placements lock") = fresh;
                    }
                }
                watcher::Event::Apply(w) => {
                    let mut map = map.write().expect("placements lock");
                    match Placed::of(&w) {
                        Some(placed) => map.insert(key(&w), placed),
                        None => map.remove(&key(&w)),
                    };
                }
                watcher::Event::Delete(w) => {
                    map.write().expect("placements lock").remove(&key(&w));
                }
            }
        }
    });
    placements
}

async fn mutate(State(state): State<WebhookState>, Json(review): Json<Value>) -> Json<Value> {
    let started = Instant::now();
    let request = &review["request"];
    let uid = request["uid"].as_str().unwrap_or_default();
    let namespace = request["namespace"].as_str().unwrap_or_default();
    let answer = decide(&state, namespace, &request["object"]).await;
    let label = match &answer {
        Answer::Allow => "allow",
        Answer::Patch(ops) if ops.is_empty() => "allow",
        Answer::Patch(_) => "rewrite",
        Answer::Deny(message) => {
            tracing::info!(namespace, %message, "pod webhook refused a pod");
            "deny"
        }
    };
    state
        .metrics
        .webhook_answers
        .get_or_create(&AnswerLabel {
            answer: label.into(),
        })
        .inc();
    state
        .metrics
        .webhook_latency
        .observe(started.elapsed().as_secs_f64());
    Json(review_response(uid, &answer))
}

/// Answers a Workload's creation: kaccel's finalizer when it is bound for a
/// ClusterQueue this installation charges, else unchanged. Never refuses: with
/// no finalizer the credit check writes it when Kueue reserves quota, as it
/// does when this webhook is not registered or not reached (`failurePolicy:
/// Ignore`).
async fn mutate_workload(
    State(state): State<WebhookState>,
    Json(review): Json<Value>,
) -> Json<Value> {
    let request = &review["request"];
    let uid = request["uid"].as_str().unwrap_or_default();
    let namespace = request["namespace"].as_str().unwrap_or_default();
    let answer = match &state.credits {
        Some((hook, local_queues)) if request["operation"] == "CREATE" => {
            let cluster_queue_of = |ns: &str, name: &str| {
                local_queues
                    .get(&reflector::ObjectRef::new(name).within(ns))
                    .map(|q| q.spec.cluster_queue.clone())
            };
            let charges = |name: &str| {
                state
                    .queues
                    .get(&reflector::ObjectRef::new(name))
                    .is_some_and(|q| {
                        instance::owns(&state.instance, q.labels())
                            && q.spec.admission_checks_strategy.as_ref().is_some_and(|s| {
                                s.admission_checks.iter().any(|c| c.name == hook.check)
                            })
                    })
            };
            let workload = &request["object"];
            if finalizer::charged(workload, namespace, cluster_queue_of, charges) {
                Answer::Patch(finalizer::add_finalizer(workload, &hook.finalizer))
            } else {
                Answer::Allow
            }
        }
        _ => Answer::Allow,
    };
    let label = match &answer {
        Answer::Patch(ops) if !ops.is_empty() => "finalizer",
        _ => "allow",
    };
    state
        .metrics
        .workload_webhook_answers
        .get_or_create(&AnswerLabel {
            answer: label.into(),
        })
        .inc();
    Json(review_response(uid, &answer))
}

/// Whether a ClusterQueue with `labels` is a class queue another kaccel
/// installation wrote: its own webhook places the pods admitted there, and two
/// webhooks rewriting one pod would fight.
fn another_installations(labels: &BTreeMap<String, String>, instance: &str) -> bool {
    labels.contains_key(CLASS_LABEL)
        && labels
            .get(MANAGED_BY_LABEL)
            .is_some_and(|by| by != instance)
}

/// The answer for one pod: left alone when it asks for no class resource, else
/// placed where Kueue admitted it, or refused with the reason and the class.
async fn decide(state: &WebhookState, namespace: &str, pod: &Value) -> Answer {
    if !asks_for_class_resource(pod) {
        return Answer::Allow;
    }
    let meta = &pod["metadata"];
    let queue = meta["labels"][LOCAL_QUEUE_LABEL]
        .as_str()
        .map(|q| format!(" (LocalQueue {q})"))
        .unwrap_or_default();
    let Some(workload) = meta["annotations"][WORKLOAD_ANNOTATION].as_str() else {
        return Answer::Deny(format!(
            "the pod asks for {} but Kueue has not admitted it{queue}: {} is only for pods of a Job submitted to the LocalQueue of an AcceleratorClass (label the Job kueue.x-k8s.io/queue-name: <class>), which Kueue places on one of the class's flavors",
            api::CLASS_RESOURCE,
            api::CLASS_RESOURCE
        ));
    };
    let pod_set = meta["labels"][POD_SET_LABEL].as_str().unwrap_or("main");
    let key = (namespace.to_string(), workload.to_string());
    let cached = state
        .placements
        .read()
        .expect("placements lock")
        .get(&key)
        .cloned();
    // The cache is used only when it agrees with what Kueue wrote into the pod
    // (the flavor's nodeLabels in its nodeSelector); otherwise, and on a miss, the
    // Workload is read from the API server.
    let agrees = |placed: &Placed| {
        placed
            .flavors
            .get(pod_set)
            .and_then(|f| state.flavors.get(&reflector::ObjectRef::new(f)))
            .is_some_and(|rf| {
                rf.spec
                    .node_labels
                    .iter()
                    .all(|(k, v)| node_selector(pod, k) == Some(v.as_str()))
            })
    };
    let placed = match cached.filter(|p| agrees(p)) {
        Some(placed) => placed,
        None => {
            let api: Api<Workload> = Api::namespaced(state.client.clone(), namespace);
            let admitted = match api.get(workload).await {
                Ok(w) => w,
                Err(e) => {
                    return Answer::Deny(format!(
                        "cannot read Workload {namespace}/{workload} to place the pod ({e}); the Job controller retries"
                    ));
                }
            };
            if admitted.status.admission.is_none() {
                return Answer::Deny(format!(
                    "Workload {namespace}/{workload} holds no quota: the pod is not admitted"
                ));
            }
            match Placed::of(&admitted) {
                Some(placed) => placed,
                None => Placed {
                    cluster_queue: admitted.cluster_queue().unwrap_or_default().to_string(),
                    flavors: BTreeMap::new(),
                },
            }
        }
    };
    let queue = state
        .queues
        .get(&reflector::ObjectRef::new(&placed.cluster_queue));
    if queue
        .as_ref()
        .is_some_and(|q| another_installations(q.labels(), &state.instance))
    {
        return Answer::Allow;
    }
    let class = queue
        .filter(|q| instance::owns(&state.instance, q.labels()))
        .and_then(|q| q.labels().get(CLASS_LABEL).cloned());
    let Some(class) = class else {
        return Answer::Deny(format!(
            "ClusterQueue {} is not an AcceleratorClass's: {} is only for the queues kaccel writes for a class",
            placed.cluster_queue,
            api::CLASS_RESOURCE
        ));
    };
    let Some(flavor) = placed.flavors.get(pod_set).cloned() else {
        return Answer::Deny(format!(
            "{class}: Kueue assigned no flavor to {} for podSet {pod_set:?} of Workload {namespace}/{workload}",
            api::CLASS_RESOURCE
        ));
    };
    let Some(resource_flavor) = state.flavors.get(&reflector::ObjectRef::new(&flavor)) else {
        return Answer::Deny(format!(
            "{class}: flavor {flavor} is not (yet) in kaccel's cache; the Job controller retries"
        ));
    };
    if !agrees(&placed) {
        return Answer::Deny(format!(
            "{class}: the pod's nodeSelector does not carry flavor {flavor}'s nodeLabels, where Kueue admitted Workload {namespace}/{workload}: it was not made from Kueue's current admission"
        ));
    }
    let annotations = resource_flavor.annotations();
    let Some(vendor_resource) = annotations.get(DEVICE_RESOURCE_ANNOTATION) else {
        return Answer::Deny(format!(
            "{class}: flavor {flavor} has no devices asked for by {} (a DRA-only or CPU flavor): ask through a ResourceClaim of its DeviceClass",
            api::CLASS_RESOURCE
        ));
    };
    let vendor: Option<Vendor> = annotations
        .get(VENDOR_ANNOTATION)
        .and_then(|v| serde_json::from_value(json!(v)).ok());
    let model = annotations
        .get(MODEL_ANNOTATION)
        .map(String::as_str)
        .unwrap_or_default();
    let class_object = state.classes.get(&reflector::ObjectRef::new(&class));
    let settings = class_object
        .as_ref()
        .and_then(|c| settings_for(&c.spec.pod_settings, vendor, model));
    let placement = Placement {
        class: &class,
        flavor: &flavor,
        vendor_resource,
        vendor,
        model,
        settings,
    };
    match rewrite(pod, &placement) {
        Ok(ops) => Answer::Patch(ops),
        Err(refusal) => Answer::Deny(format!("{class}: {refusal}")),
    }
}

/// The pod's `spec.nodeSelector[key]`.
fn node_selector<'a>(pod: &'a Value, key: &str) -> Option<&'a str> {
    pod["spec"]["nodeSelector"][key].as_str()
}

/// The TLS listener axum serves on: a handshake that fails is logged and
/// dropped, never the server.
struct TlsListener {
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (tcp, peer) = match self.listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "pod webhook accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            match self.acceptor.accept(tcp).await {
                Ok(tls) => return (tls, peer),
                Err(e) => tracing::debug!(error = %e, %peer, "pod webhook TLS handshake failed"),
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

fn tls_acceptor(tls: &TlsMaterial) -> Result<tokio_rustls::TlsAcceptor, Error> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(tls.cert.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| Error::Webhook(format!("the webhook certificate is not PEM: {e}")))?;
    let key = PrivateKeyDer::from_pem_slice(tls.key.as_bytes())
        .map_err(|e| Error::Webhook(format!("the webhook key is not PEM: {e}")))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Webhook(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            Error::Webhook(format!("the webhook certificate and key do not match: {e}"))
        })?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// The generated certificate every replica serves: read from the Secret, or
/// generated and stored there by the first replica to start (a replica that
/// loses the create race reads the winner's).
async fn generated_certificate(
    client: &Client,
    config: &Webhook,
    instance: &str,
) -> Result<TlsMaterial, Error> {
    let (namespace, name) = config.secret_ref().ok_or_else(|| {
        Error::Webhook(format!(
            "webhook.secret {:?} is not NAMESPACE/NAME",
            config.secret
        ))
    })?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    for _ in 0..3 {
        if let Some(secret) = secrets
            .get_opt(name)
            .await
            .map_err(api_err(format!("reading Secret {namespace}/{name}")))?
        {
            return material_of(&secret)
                .ok_or_else(|| Error::Webhook(format!("Secret {namespace}/{name} lacks tls.crt, tls.key or ca.crt: delete it and kaccel generates a new one")));
        }
        let fresh = generate(&config.hosts)?;
        let secret: Secret = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {MANAGED_BY_LABEL: instance}},
            "stringData": {"tls.crt": fresh.cert, "tls.key": fresh.key,
                           "ca.crt": fresh.ca.clone().unwrap_or_default()}
        }))
        .expect("a Secret");
        match secrets.create(&PostParams::default(), &secret).await {
            Ok(_) => {
                tracing::info!(secret = %format!("{namespace}/{name}"), hosts = ?config.hosts, "generated the pod webhook's certificate");
                return Ok(fresh);
            }
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(api_err(format!("creating Secret {namespace}/{name}"))(e)),
        }
    }
    Err(Error::Webhook(format!(
        "Secret {namespace}/{name} keeps changing under kaccel"
    )))
}

fn material_of(secret: &Secret) -> Option<TlsMaterial> {
    let data = secret.data.as_ref()?;
    let text = |k: &str| -> Option<String> {
        let ByteString(bytes) = data.get(k)?;
        String::from_utf8(bytes.clone()).ok()
    };
    Some(TlsMaterial {
        cert: text("tls.crt")?,
        key: text("tls.key")?,
        ca: Some(text("ca.crt")?),
    })
}

/// A CA and a serving certificate for `hosts` (DNS names or IP addresses), with
/// rcgen's default validity (to the year 4096): kaccel renews neither; delete the
/// Secret to replace both.
fn generate(hosts: &[String]) -> Result<TlsMaterial, Error> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let fail = |e: rcgen::Error| Error::Webhook(format!("generating the webhook certificate: {e}"));
    let ca_key = KeyPair::generate().map_err(fail)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(fail)?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "kaccel pod webhook CA");
    let ca_cert = ca_params.self_signed(&ca_key).map_err(fail)?;
    let leaf_key = KeyPair::generate().map_err(fail)?;
    let mut leaf = CertificateParams::new(hosts.to_vec()).map_err(fail)?;
    leaf.distinguished_name.push(
        DnType::CommonName,
        hosts
            .first()
            .map(String::as_str)
            .unwrap_or("kaccel-webhook"),
    );
    let issuer = Issuer::new(ca_params, ca_key);
    let cert = leaf.signed_by(&leaf_key, &issuer).map_err(fail)?;
    Ok(TlsMaterial {
        cert: cert.pem(),
        key: leaf_key.serialize_pem(),
        ca: Some(ca_cert.pem()),
    })
}

/// Keeps the `caBundle` of every webhook of `configuration` equal to `ca`:
/// checked every 30 s, so a configuration applied after kaccel started (or
/// re-applied without the bundle) is fixed without a restart.
async fn keep_ca_bundle(client: Client, configuration: String, ca: String) {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client);
    let want = ByteString(ca.into_bytes());
    loop {
        match api.get_opt(&configuration).await {
            Ok(Some(current)) => {
                let stale: Vec<Value> = current
                    .webhooks
                    .unwrap_or_default()
                    .iter()
                    .filter(|w| w.client_config.ca_bundle.as_ref() != Some(&want))
                    .map(|w| json!({"name": w.name, "clientConfig": {"caBundle": want}}))
                    .collect();
                if !stale.is_empty() {
                    // Strategic merge: webhooks merge by name, so only caBundle moves.
                    let patch = Patch::Strategic(json!({"webhooks": stale}));
                    match api
                        .patch(&configuration, &PatchParams::default(), &patch)
                        .await
                    {
                        Ok(_) => {
                            tracing::info!(%configuration, "wrote the pod webhook's CA bundle")
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, %configuration, "cannot write the pod webhook's CA bundle")
                        }
                    }
                }
            }
            Ok(None) => {
                tracing::info!(%configuration, "MutatingWebhookConfiguration not found yet (manifests/webhook.yaml)")
            }
            Err(e) => {
                tracing::warn!(error = %e, %configuration, "cannot read the MutatingWebhookConfiguration")
            }
        }
        tokio::time::sleep(Duration::from_secs(30)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::labels;

    #[test]
    fn only_another_kaccel_installations_class_queues_are_left_to_it() {
        let theirs = labels(&[(MANAGED_BY_LABEL, "kaccel-b"), (CLASS_LABEL, "inference")]);
        assert!(another_installations(&theirs, "kaccel"));
        assert!(!another_installations(&theirs, "kaccel-b"));
        // A hand-made queue (no class label) is nobody's class queue: refused
        // as before, not waved through.
        let hand_made = labels(&[(MANAGED_BY_LABEL, "terraform")]);
        assert!(!another_installations(&hand_made, "kaccel"));
        assert!(!another_installations(&labels(&[]), "kaccel"));
    }
}
