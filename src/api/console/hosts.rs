//! Which requests the console answers: those addressed to it, and, for a request that would
//! change something, those sent from its own pages.
//!
//! **Host** (every request, in every mode): a page of another site whose name an attacker
//! points at the console's address (DNS rebinding) reaches the console with that site's name
//! in `Host`, and the browser treats the console's answers as that site's. So the console
//! answers only to:
//!
//! - a name of `allowed_hosts` (`host` for any port, `host:port` for that port only);
//! - its listen address's IP literal, and any loopback IP literal or `localhost` when it
//!   listens on loopback (any port: `kubectl port-forward` and SSH tunnels pick their own);
//! - any IP literal or `localhost` when it listens on every address (`0.0.0.0`, `::`): a
//!   browser that was sent to an IP address connected to that address, no name was resolved.
//!
//! Anything else (or no `Host` at all) gets 421 and the console's refusal page.
//!
//! **Origin** (requests that would change something): a form sent by another site is
//! refused with 403 before it reaches a page when the browser says so, by `Sec-Fetch-Site`
//! (`cross-site`, `same-site`) or by an `Origin` that is not the request's own `Host`.
//! (`Origin: null` tells nothing: with the pages' `no-referrer` policy, browsers send it for
//! the console's own forms.) Browsers sending neither header are left to the CSRF tokens of
//! [`super::session`].

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;

use super::view;

/// The names the console answers to.
#[derive(Debug, Clone)]
pub struct HostRule {
    listen: IpAddr,
    allowed: Vec<String>,
}

impl HostRule {
    /// The names of a console listening on `listen`, with `allowed` ones besides.
    pub fn new(listen: SocketAddr, allowed: &[String]) -> Self {
        Self {
            listen: listen.ip(),
            allowed: allowed
                .iter()
                .map(|name| name.trim().to_ascii_lowercase())
                .filter(|name| !name.is_empty())
                .collect(),
        }
    }

    /// Whether a request for `authority` (a `Host` value: `name`, `name:port`, `[v6]:port`)
    /// is addressed to this console.
    pub fn allows(&self, authority: &str) -> bool {
        let authority = authority.trim().to_ascii_lowercase();
        let host = host_of(&authority);
        if host.is_empty() {
            return false;
        }
        if self
            .allowed
            .iter()
            .any(|name| *name == authority || *name == host)
        {
            return true;
        }
        let everywhere = self.listen.is_unspecified();
        let loopback = self.listen.is_loopback();
        match host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        {
            Ok(ip) => everywhere || ip == self.listen || (loopback && ip.is_loopback()),
            Err(_) => host == "localhost" && (loopback || everywhere),
        }
    }
}

/// The host of `authority`, without its port.
fn host_of(authority: &str) -> &str {
    if authority.starts_with('[') {
        return match authority.find(']') {
            Some(end) => &authority[..=end],
            None => "",
        };
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => authority,
    }
}

/// The authority a request is addressed to: HTTP/2's `:authority`, else `Host`.
fn authority_of(request: &Request) -> Option<String> {
    if let Some(authority) = request.uri().authority() {
        return Some(authority.as_str().to_owned());
    }
    request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// Refuses, before any handler, a request addressed to another name than the console's, and
/// a request that would change something sent from another site.
pub(super) async fn same_origin(
    State(rule): State<Arc<HostRule>>,
    request: Request,
    next: Next,
) -> Response {
    let authority = authority_of(&request);
    let Some(authority) = authority.filter(|a| rule.allows(a)) else {
        tracing::info!("console request refused: addressed to another host");
        return view::error_page(
            None,
            StatusCode::MISDIRECTED_REQUEST,
            "Wrong address",
            "This console answers only to its own address (a page of another site may have \
             sent you here): nothing was read or changed. Open the console by the address \
             its operator gave you.",
        );
    };
    let changes = !matches!(*request.method(), Method::GET | Method::HEAD);
    if changes && from_another_site(&request, &authority) {
        tracing::info!("console request refused: sent from another site");
        return view::error_page(
            None,
            StatusCode::FORBIDDEN,
            "Request refused",
            "This request came from another site: nothing was changed.",
        );
    }
    next.run(request).await
}

/// Whether the browser says `request` (to `authority`) was sent by another site.
fn from_another_site(request: &Request, authority: &str) -> bool {
    let headers = request.headers();
    let fetch_site = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok());
    if matches!(fetch_site, Some("cross-site" | "same-site")) {
        return true;
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return false;
    };
    let Ok(origin) = origin.to_str() else {
        return true;
    };
    // `null` says nothing: browsers send it for the console's own forms too, since its
    // pages' referrer policy is `no-referrer`; a `null` from another site's sandboxed frame
    // comes with `Sec-Fetch-Site: cross-site`.
    if origin == "null" {
        return false;
    }
    match origin.split_once("://") {
        Some((_, rest)) => !rest.trim_end_matches('/').eq_ignore_ascii_case(authority),
        None => true,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn rule(listen: &str, allowed: &[&str]) -> HostRule {
        let allowed: Vec<String> = allowed.iter().map(|s| (*s).to_owned()).collect();
        HostRule::new(listen.parse().unwrap(), &allowed)
    }

    #[test]
    fn a_loopback_console_answers_to_loopback_names_on_any_port_only() {
        let rule = rule("127.0.0.1:8090", &[]);
        for host in [
            "127.0.0.1:8090",
            "127.0.0.1:9000",
            "localhost:8090",
            "LOCALHOST",
            "[::1]:8090",
            "127.0.0.2",
        ] {
            assert!(rule.allows(host), "{host}");
        }
        for host in [
            "evil.example:8090",
            "evil.example",
            "localhost.evil.example:8090",
            "10.0.0.1:8090",
            "",
            ":8090",
            "[::1",
        ] {
            assert!(!rule.allows(host), "{host}");
        }
    }

    #[test]
    fn other_consoles_answer_to_their_address_and_the_allowed_names() {
        let rule = rule("10.1.2.3:8090", &["console.internal", "review.example:443"]);
        assert!(rule.allows("10.1.2.3:8090"));
        assert!(rule.allows("console.internal:8090"));
        assert!(rule.allows("Console.Internal"));
        assert!(rule.allows("review.example:443"));
        assert!(!rule.allows("review.example:8443"));
        assert!(!rule.allows("localhost:8090"), "not listening on loopback");
        assert!(!rule.allows("127.0.0.1:8090"));
        assert!(!rule.allows("evil.example:8090"));
        let everywhere = super::tests::rule("0.0.0.0:8090", &[]);
        assert!(everywhere.allows("192.0.2.7:8090"));
        assert!(everywhere.allows("[2001:db8::1]:8090"));
        assert!(everywhere.allows("localhost:8090"));
        assert!(!everywhere.allows("evil.example:8090"));
    }
}
