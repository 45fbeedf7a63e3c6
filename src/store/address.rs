//! The store's address, as `XPU_ZEBIN_REMOTE` gives it, in the URL forms redis-py (and so
//! Inductor and the last release of this package) takes: `redis://[[user]:password@]host
//! [:port][/db]`, `rediss://` for TLS, `unix://[[user]:password@]/path?db=N`; query
//! parameters `db`, `username`, `password`, `client_name`, `socket_timeout` and
//! `socket_connect_timeout` (seconds: the store's timeout for this address), `protocol`
//! (2: RESP2, what this client speaks), and for TLS `ssl_ca_certs`, `ssl_certfile`,
//! `ssl_keyfile`, `ssl_cert_reqs` (`required` or `optional`: the server's certificate is
//! checked; `none`: any certificate), `ssl_check_hostname`. Any other parameter is an
//! error naming it, never ignored.

use percent_encoding::percent_decode_str;
use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tls {
    /// Certificates to trust (PEM); none: the system's.
    pub ca_certs: Option<PathBuf>,
    /// A client certificate and its key (PEM), for servers that ask for one.
    pub client: Option<(PathBuf, PathBuf)>,
    /// `ssl_cert_reqs=none`: the server's certificate is not checked (entries are still
    /// verified by their signatures).
    pub accept_any: bool,
    /// `ssl_check_hostname=false`: the certificate's chain is checked, not its name.
    pub check_hostname: bool,
}

impl Default for Tls {
    fn default() -> Self {
        Tls {
            ca_certs: None,
            client: None,
            accept_any: false,
            check_hostname: true,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    pub endpoint: Endpoint,
    pub tls: Option<Tls>,
    pub username: Option<String>,
    pub password: Option<String>,
    pub db: u32,
    pub client_name: Option<String>,
    /// `socket_timeout` / `socket_connect_timeout`: this address's timeout.
    pub timeout: Option<std::time::Duration>,
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
        // User info ends at the last '@' of the authority: for a socket, before its path.
        let (auth, rest) = match scheme {
            "unix" => match rest.split_once('/') {
                Some((head, _)) if head.contains('@') => {
                    let (auth, _) = head.rsplit_once('@').unwrap_or((head, ""));
                    (Some(auth), &rest[auth.len() + 1..])
                }
                _ => (None, rest),
            },
            // As urllib (redis-py) reads it: the authority ends at the first '/' or '?'.
            _ => {
                let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
                match rest[..end].rsplit_once('@') {
                    Some((auth, _)) => (Some(auth), &rest[auth.len() + 1..]),
                    None => (None, rest),
                }
            }
        };
        let (location, query) = rest.split_once('?').unwrap_or((rest, ""));
        let mut address = Address {
            endpoint: Endpoint::Unix(PathBuf::new()),
            tls: None,
            username: None,
            password: None,
            db: 0,
            client_name: None,
            timeout: None,
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
            ("client_name", _) => self.client_name = Some(value.to_string()),
            ("socket_timeout" | "socket_connect_timeout", _) => {
                let t = crate::knobs::parse_seconds(value)
                    .filter(|t| !t.is_zero())
                    .ok_or_else(|| format!("{name}={value:?}: seconds, above 0"))?;
                self.timeout = Some(self.timeout.map_or(t, |had| had.min(t)));
            }
            ("protocol", _) if value == "2" => {}
            ("protocol", _) => return Err(format!("protocol={value:?}: this client speaks 2")),
            ("ssl_check_hostname", Some(tls)) => {
                tls.check_hostname = crate::knobs::parse_bool(value)
                    .ok_or_else(|| format!("ssl_check_hostname={value:?}: true or false"))?
            }
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
                "required" | "cert_required" | "optional" | "cert_optional" => {
                    tls.accept_any = false
                }
                "none" | "cert_none" => tls.accept_any = true,
                other => return Err(format!("ssl_cert_reqs={other:?}: required or none")),
            },
            (n, None) if n.starts_with("ssl_") => {
                return Err(format!("parameter {n:?} is for rediss:// (TLS) only"))
            }
            (n, _) => {
                return Err(format!(
                    "parameter {n:?} is not one this client takes (db, username, password, \
                     client_name, socket_timeout, socket_connect_timeout, protocol, \
                     ssl_ca_certs, ssl_certfile, ssl_keyfile, ssl_cert_reqs, \
                     ssl_check_hostname)"
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
        match after {
            "" => (host, None),
            _ => (
                host,
                Some(after.strip_prefix(':').ok_or("text after an IPv6 host")?),
            ),
        }
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

/// `url` without its credentials: user info (all before the last '@', whatever it
/// holds) and query (where a password may also be).
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<an address that does not parse>".into();
    };
    let (who, rest) = match rest.rsplit_once('@') {
        Some((_, after)) => ("***@", after),
        None => ("", rest),
    };
    match rest.split_once('?') {
        Some((location, _)) => format!("{scheme}://{who}{location}?***"),
        None => format!("{scheme}://{who}{rest}"),
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
        let a = Address::parse("unix:///tmp/a@b/redis.sock").unwrap();
        assert_eq!(
            (a.endpoint, a.username),
            (Endpoint::Unix("/tmp/a@b/redis.sock".into()), None)
        );
        let a = Address::parse("unix://u:p@/run/r.sock").unwrap();
        assert_eq!(a.endpoint, Endpoint::Unix("/run/r.sock".into()));
        assert_eq!(
            (a.username.as_deref(), a.password.as_deref()),
            (Some("u"), Some("p"))
        );
        let a = Address::parse("redis://h/0?socket_timeout=5&client_name=n&protocol=2").unwrap();
        assert_eq!(
            (a.timeout, a.client_name.as_deref()),
            (Some(std::time::Duration::from_secs(5)), Some("n"))
        );
    }

    #[test]
    fn what_it_cannot_honour_is_an_error() {
        for bad in [
            "http://x",
            "redis://h:99999/0",
            "redis://h/x",
            "redis://h/0?socket_timeout=0",
            "redis://h/0?retry_on_timeout=yes",
            "redis://h/0?ssl_ca_certs=/x",
            "rediss://h/0?ssl_cert_reqs=maybe",
            "redis://[::1]junk:7000/0",
            "redis://[::1]7000",
            "redis://h/0?protocol=3",
            "unix://",
        ] {
            assert!(Address::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn credentials_are_never_said() {
        assert_eq!(redacted("redis://u:secret@h:1/0"), "redis://***@h:1/0");
        assert_eq!(redacted("unix:///s?password=secret"), "unix:///s?***");
        assert_eq!(
            redacted("redis://user:s3cr3t?x@h:6379/0"),
            "redis://***@h:6379/0"
        );
    }
}
