//! The labels and shared annotations kaccel sets and reads back, in one place so
//! the floor that writes one and the floors that read it agree.

/// Set to the installation's instance (see [`super::instance`]) on every object
/// kaccel creates: what that installation may change or delete, and nothing else.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// The AcceleratorClass a flavor or ClusterQueue serves.
pub const CLASS_LABEL: &str = "kaccel.io/class";
/// The CreditBudget a Cohort, ClusterQueue or LocalQueue belongs to.
pub const BUDGET_LABEL: &str = "kaccel.io/budget";
/// The team of a budget's queues.
pub const TEAM_LABEL: &str = "kaccel.io/team";
/// On a ResourceFlavor kaccel created: its own name, so a selector finds it.
pub const FLAVOR_LABEL: &str = "kaccel.io/flavor";
/// On a ResourceFlavor kaccel created: the resource a pod asks for to be given
/// its devices (`nvidia.com/gpu`; on a DRA-only flavor the implicit extended
/// resource of its DeviceClass), what the pod webhook rewrites
/// `kaccel.io/accelerator` into on that flavor.
pub const DEVICE_RESOURCE_ANNOTATION: &str = "kaccel.io/device-resource";
/// On a ResourceFlavor kaccel created: its devices' vendor (`nvidia`) and model.
pub const VENDOR_ANNOTATION: &str = "kaccel.io/vendor";
pub const MODEL_ANNOTATION: &str = "kaccel.io/model";
/// The node label that pins a CPU-only class without `selector.nodeLabels`:
/// `kaccel.io/pool=cpu`. Kueue's nodeLabels cannot say "no accelerator", so the
/// platform team labels its CPU-only nodes; the flavor selects exactly those, and its
/// quota counts only those that carry no accelerator of any kind.
pub const CPU_POOL_LABEL: &str = "kaccel.io/pool";
/// The value of [`CPU_POOL_LABEL`] on CPU-only nodes.
pub const CPU_POOL_VALUE: &str = "cpu";

/// On a Workload kaccel's health loop evicted: which node and why. The node
/// actions write it; the ledger reads it as a platform-caused end (refundable).
pub const EVICTED_FOR_ANNOTATION: &str = "kaccel.io/evicted-for";
