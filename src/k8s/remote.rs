//! Clients for other clusters (MultiKueue workers) from a kubeconfig kept in a
//! Secret, as Kueue's MultiKueue keeps it.

use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::Api;

/// The key of the kubeconfig in a worker's Secret (Kueue's
/// `MultiKueueConfigSecretKey`).
pub const KUBECONFIG_KEY: &str = "kubeconfig";

/// A client for the cluster the kubeconfig in Secret `namespace/name` (key
/// `kubeconfig`) reaches; the error names what is missing or wrong.
pub async fn client_from_secret(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Client, String> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = secrets
        .get_opt(name)
        .await
        .map_err(|e| format!("cannot read Secret {namespace}/{name}: {e}"))?
        .ok_or_else(|| format!("Secret {namespace}/{name} does not exist"))?;
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(KUBECONFIG_KEY))
        .ok_or_else(|| format!("Secret {namespace}/{name} has no key {KUBECONFIG_KEY:?}"))?;
    let text = std::str::from_utf8(&bytes.0)
        .map_err(|_| format!("Secret {namespace}/{name} key {KUBECONFIG_KEY}: not UTF-8"))?;
    let kubeconfig = kube::config::Kubeconfig::from_yaml(text).map_err(|e| {
        format!("Secret {namespace}/{name} key {KUBECONFIG_KEY}: not a kubeconfig: {e}")
    })?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|e| format!("Secret {namespace}/{name} key {KUBECONFIG_KEY}: {e}"))?;
    Client::try_from(config).map_err(|e| format!("a client from Secret {namespace}/{name}: {e}"))
}
