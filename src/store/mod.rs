//! Every level of native code behind one lookup (`levels`: the order of the levels and
//! what a hit does, in one place; the engine asks, the levels answer). The local level is
//! `crate::cache`; the fleet's level is a remote store on Redis (`remote`: its settings,
//! what this process saw of it; `format`: the signed value; `client`, `connection`,
//! `resp`, `address`, `any_cert`: the bounded client). `accounts` counts what each request
//! did, in the ledger of its cache directory.

pub mod accounts;
pub mod address;
mod any_cert;
pub mod client;
pub mod connection;
pub mod format;
pub mod levels;
pub mod remote;
pub mod resp;
