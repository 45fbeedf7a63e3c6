//! The fleet's level of native code: a remote store on Redis (`remote`: its settings,
//! what this process saw of it; `format`: the signed value; `client`, `connection`,
//! `resp`, `address`, `any_cert`: the bounded client). The levels' lookup, their order and
//! their claims are the `levels` module.

pub mod address;
mod any_cert;
pub mod client;
pub mod connection;
pub mod format;
pub mod remote;
pub mod resp;
