//! The ground floor: what every layer above needs to speak to Kubernetes, and
//! nothing of kaccel's own policy. API groups and resources ([`resources`]),
//! quantities ([`quantity`]), kaccel's labels ([`labels`]) and installation
//! ([`instance`]), names and globs
//! ([`names`]), timestamps
//! ([`time`]). It imports nothing from the rest of the crate, so any floor can
//! use it without reaching up.

pub mod instance;
pub mod labels;
pub mod names;
pub mod quantity;
pub mod remote;
pub mod resources;
pub mod time;
