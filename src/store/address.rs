//! The store's address, as `XPU_ZEBIN_REMOTE` gives it, in the URL forms redis-py (and so
//! Inductor and the last release of this package) takes: `redis://[[user]:password@]host
//! [:port][/db]`, `rediss://` for TLS, `unix://[[user]:password@]/path?db=N`; query
//! parameters `db`, `username`, `password`, and for TLS `ssl_ca_certs`, `ssl_certfile`,
//! `ssl_keyfile`, `ssl_cert_reqs` (`required`, or `none`: any certificate). Any other
//! parameter is an error naming it, never ignored.

use percent_encoding::percent_decode_str;
use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Tls {
    /// Certificates to trust (PEM); none: the system's.
    pub ca_certs: Option<PathBuf>,
    /// A client certificate and its key (PEM), for servers that ask for one.
    pub client: Option<(PathBuf, PathBuf)>,
    /// `ssl_cert_reqs=none`: the server's certificate is not checked (entries are still
    /// verified by their signatures).
    pub accept_any: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    pub endpoint: Endpoint,
    pub tls: Option<Tls>,
    pub username: Option<String>,
    pub password: Option<String>,
    pub db: u32,
}

fn decoded(text: &str) -> Result<String, String> {
    percent_decode_str(text)
        .decode_utf8()
        .map(|t| t.into_owned())
        .map_err(|_| "a percent-encoded part that is not UTF-8".to_string())
}

fn db_number(text: &str) -> Result<u32, String> {
    text.parse::<u32>()
        .map_err(|_| format!("database {text:?} is not a number"))
}

impl Address {
    pub fn parse(url: &str) -> Result<Address, String> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or("expected redis://, rediss:// or unix://")?;
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (auth, location) = match rest.rsplit_once('@') {
            Some((auth, location)) => (Some(auth), location),
            None => (None, rest),
        };
        let mut address = Address {
            endpoint: Endpoint::Unix(PathBuf::new()),
            tls: None,
            username: None,
            password: None,
            db: 0,
        };
        if let Some(auth) = auth {
            let (user, password) = match auth.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (auth, None),
            };
            address.username = Some(decoded(user)?).filter(|u| !u.is_empty());
            address.password = password.map(decoded).transpose()?;
        }
        match scheme {
            "redis" | "rediss" => {
                let (hostport, db) = location.split_once('/').unwrap_or((location, ""));
                address.endpoint = tcp_endpoint(hostport)?;
                if !db.is_empty() {
                    address.db = db_number(db)?;
                }
                if scheme == "rediss" {
                    address.tls = Some(Tls::default());
                }
            }
            "unix" => {
                if location.is_empty() {
                    return Err("unix:// names no socket path".into());
                }
                address.endpoint = Endpoint::Unix(PathBuf::from(decoded(location)?));
            }
            other => return Err(format!("scheme {other:?}: expected redis, rediss or unix")),
        }
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            address.apply(name, &decoded(value)?)?;
        }
        Ok(address)
    }

    fn apply(&mut self, name: &str, value: &str) -> Result<(), String> {
        let path = || PathBuf::from(value);
        match (name, self.tls.as_mut()) {
            ("db", _) => self.db = db_number(value)?,
            ("password", _) => self.password = Some(value.to_string()),
            ("username", _) => self.username = Some(value.to_string()).filter(|u| !u.is_empty()),
            ("ssl_ca_certs", Some(tls)) => tls.ca_certs = Some(path()),
            ("ssl_certfile", Some(tls)) => {
                let key = tls.client.take().map(|(_, k)| k).unwrap_or_else(path);
                tls.client = Some((path(), key));
            }
            ("ssl_keyfile", Some(tls)) => {
                let cert = tls.client.take().map(|(c, _)| c).unwrap_or_else(path);
                tls.client = Some((cert, path()));
            }
            ("ssl_cert_reqs", Some(tls)) => match value.to_ascii_lowercase().as_str() {
                "required" | "cert_required" => tls.accept_any = false,
                "none" | "cert_none" => tls.accept_any = true,
                other => return Err(format!("ssl_cert_reqs={other:?}: required or none")),
            },
            (n, None) if n.starts_with("ssl_") => {
                return Err(format!("parameter {n:?} is for rediss:// (TLS) only"))
            }
            (n, _) => {
                return Err(format!(
                    "parameter {n:?} is not one this client takes (db, username, password, \
                     ssl_ca_certs, ssl_certfile, ssl_keyfile, ssl_cert_reqs)"
                ))
            }
        }
        Ok(())
    }
}

fn tcp_endpoint(hostport: &str) -> Result<Endpoint, String> {
    let (host, port) = if let Some(inner) = hostport.strip_prefix('[') {
        let (host, after) = inner
            .split_once(']')
            .ok_or("an IPv6 host without its ']'")?;
        (host, after.strip_prefix(':'))
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    let host = decoded(host)?;
    let host = if host.is_empty() {
        "localhost".to_string()
    } else {
        host
    };
    let port = match port {
        None | Some("") => 6379,
        Some(p) => p
            .parse::<u16>()
            .map_err(|_| format!("port {p:?} is not a port"))?,
    };
    Ok(Endpoint::Tcp { host, port })
}

/// `url` without its credentials: user info and query (where a password may also be).
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<an address that does not parse>".into();
    };
    let (rest, query) = match rest.split_once('?') {
        Some((r, _)) => (r, "?***"),
        None => (rest, ""),
    };
    match rest.rsplit_once('@') {
        Some((_, location)) => format!("{scheme}://***@{location}{query}"),
        None => format!("{scheme}://{rest}{query}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forms_redis_py_takes() {
        let a = Address::parse("redis://farm:p%40ss@127.0.0.1:7000/3").unwrap();
        assert_eq!(
            a.endpoint,
            Endpoint::Tcp {
                host: "127.0.0.1".into(),
                port: 7000
            }
        );
        assert_eq!(
            (a.username.as_deref(), a.password.as_deref(), a.db),
            (Some("farm"), Some("p@ss"), 3)
        );
        let a = Address::parse("redis://:pw@h").unwrap();
        assert_eq!(
            (a.username, a.password.as_deref(), a.db),
            (None, Some("pw"), 0)
        );
        let a = Address::parse("rediss://[::1]:6380/0?ssl_ca_certs=/x/ca.pem").unwrap();
        assert_eq!(a.tls.unwrap().ca_certs, Some(PathBuf::from("/x/ca.pem")));
        let a = Address::parse("unix:///run/redis.sock?db=2&password=pw").unwrap();
        assert_eq!(a.endpoint, Endpoint::Unix("/run/redis.sock".into()));
        assert_eq!((a.db, a.password.as_deref()), (2, Some("pw")));
    }

    #[test]
    fn what_it_cannot_honour_is_an_error() {
        for bad in [
            "http://x",
            "redis://h:99999/0",
            "redis://h/x",
            "redis://h/0?socket_timeout=5",
            "redis://h/0?ssl_ca_certs=/x",
            "rediss://h/0?ssl_cert_reqs=maybe",
            "unix://",
        ] {
            assert!(Address::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn credentials_are_never_said() {
        assert_eq!(redacted("redis://u:secret@h:1/0"), "redis://***@h:1/0");
        assert_eq!(redacted("unix:///s?password=secret"), "unix:///s?***");
    }
}
