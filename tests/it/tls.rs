//! TLS and mutual TLS: the seven-step check over both, clients refused without the CA or
//! without a client certificate, and the shipped binaries (server and operator console)
//! configured with certificate files and bearer tokens. Certificates are made per test.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::seven_steps::run_with_reconcile_operation;
use common::*;
use opjournal::api::tls::{self, ServerTlsFiles};
use opjournal::proto::GetOperationRequest;
use opjournal::proto::operation_journal_client::OperationJournalClient;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use sha2::Digest as _;
use sqlx::PgPool;
use tempfile::TempDir;
use tokio::io::AsyncReadExt;
use tonic::transport::{Channel, ClientTlsConfig};

/// A throwaway PKI: a CA, a server certificate for 127.0.0.1 and localhost, a client
/// certificate, and a second CA with its own client certificate that the server must not
/// trust.
struct Pki {
    dir: TempDir,
    /// The CA of `ca.pem`, for certificates made later (a renewal).
    issuer: Option<Issuer<'static, KeyPair>>,
}

impl Pki {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut pki = Self { dir, issuer: None };
        let ca = pki.ca("opjournal test CA", "ca");
        pki.leaf(
            &ca,
            "server",
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        pki.leaf(&ca, "client", &[], ExtendedKeyUsagePurpose::ClientAuth);
        let other = pki.ca("another CA", "other-ca");
        pki.leaf(
            &other,
            "other-client",
            &[],
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        pki.issuer = Some(ca);
        pki
    }

    /// A new server certificate and key from the same CA, as a renewal makes them.
    fn renew_server(&self, file: &str) {
        self.leaf(
            self.issuer.as_ref().unwrap(),
            file,
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn ca(&self, common_name: &str, file: &str) -> Issuer<'static, KeyPair> {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        std::fs::write(self.path(&format!("{file}.pem")), cert.pem()).unwrap();
        Issuer::new(params, key)
    }

    fn leaf(
        &self,
        issuer: &Issuer<'static, KeyPair>,
        file: &str,
        names: &[&str],
        usage: ExtendedKeyUsagePurpose,
    ) {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params.distinguished_name.push(DnType::CommonName, file);
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, issuer).unwrap();
        std::fs::write(self.path(&format!("{file}.pem")), cert.pem()).unwrap();
        std::fs::write(self.path(&format!("{file}-key.pem")), key.serialize_pem()).unwrap();
    }

    fn server_files(&self, mutual: bool) -> ServerTlsFiles {
        ServerTlsFiles {
            cert_file: self.path("server.pem"),
            key_file: self.path("server-key.pem"),
            client_ca_file: mutual.then(|| self.path("ca.pem")),
        }
    }

    /// A client that trusts `ca` and presents `identity` (a certificate file's stem).
    fn client(&self, ca: &str, identity: Option<&str>) -> ClientTlsConfig {
        let cert = identity.map(|stem| self.path(&format!("{stem}.pem")));
        let key = identity.map(|stem| self.path(&format!("{stem}-key.pem")));
        tls::client_config(
            Some(&self.path(&format!("{ca}.pem"))),
            cert.as_deref().zip(key.as_deref()),
        )
        .unwrap()
    }
}

async fn spawn_tls(pool: PgPool, pki: &Pki, mutual: bool) -> TestApp {
    let identity = mutual.then_some("client");
    TestApp::spawn_with_options(
        pool,
        SpawnOptions {
            tls: Some(tls::server_config(&pki.server_files(mutual)).unwrap()),
            client_tls: Some(pki.client("ca", identity)),
            ..SpawnOptions::default()
        },
    )
    .await
}

/// Connects to `url` (with `tls`, if any) and makes one call. Any failure counts: a TLS
/// 1.3 server may refuse a client certificate only after the client finished its side of
/// the handshake, so the refusal can surface at the first call rather than at connect.
async fn call(url: String, tls: Option<ClientTlsConfig>) -> Result<(), String> {
    let mut endpoint = Channel::from_shared(url).unwrap();
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(tls).map_err(|e| e.to_string())?;
    }
    let channel = tokio::time::timeout(Duration::from_secs(10), endpoint.connect())
        .await
        .map_err(|_| "connect timed out".to_owned())?
        .map_err(|e| format!("connect: {e}"))?;
    let answer = OperationJournalClient::new(channel)
        .get_operation(GetOperationRequest {
            namespace: String::new(),
            operation_key: "anything".into(),
        })
        .await;
    match answer {
        // NOT_FOUND is an answer from the journal: the connection worked.
        Err(status) if status.code() == tonic::Code::NotFound => Ok(()),
        Ok(_) => Ok(()),
        Err(status) => Err(format!("call: {status:?}")),
    }
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_seven_step_check_holds_over_tls(pool: PgPool) {
    let pki = Pki::new();
    let app = spawn_tls(pool, &pki, false).await;
    run_with_reconcile_operation(&app).await;
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_seven_step_check_holds_over_mutual_tls(pool: PgPool) {
    let pki = Pki::new();
    let app = spawn_tls(pool, &pki, true).await;
    run_with_reconcile_operation(&app).await;
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_client_without_the_ca_cannot_connect(pool: PgPool) {
    let pki = Pki::new();
    let app = spawn_tls(pool, &pki, false).await;
    let url = format!("https://{}", app.addr);
    call(url.clone(), Some(pki.client("ca", None)))
        .await
        .expect("a client with the CA connects");
    // Trusting another CA only, or nothing at all (no roots), the handshake fails.
    let refused = call(url.clone(), Some(pki.client("other-ca", None))).await;
    assert!(refused.is_err(), "{refused:?}");
    let refused = call(url, Some(ClientTlsConfig::new())).await;
    assert!(refused.is_err(), "{refused:?}");
    // Plaintext to the TLS port gets nowhere either.
    let refused = call(format!("http://{}", app.addr), None).await;
    assert!(refused.is_err(), "{refused:?}");
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn under_mutual_tls_a_client_without_a_trusted_certificate_cannot_connect(pool: PgPool) {
    let pki = Pki::new();
    let app = spawn_tls(pool, &pki, true).await;
    let url = format!("https://{}", app.addr);
    call(url.clone(), Some(pki.client("ca", Some("client"))))
        .await
        .expect("a client with a certificate from the CA connects");
    let refused = call(url.clone(), Some(pki.client("ca", None))).await;
    assert!(refused.is_err(), "no client certificate: {refused:?}");
    let refused = call(url, Some(pki.client("ca", Some("other-client")))).await;
    assert!(
        refused.is_err(),
        "a certificate from another CA: {refused:?}"
    );
}

#[test]
fn unusable_certificate_files_are_named_at_start() {
    opjournal::app::install_crypto_provider();
    let pki = Pki::new();
    let mut files = pki.server_files(true);
    files.key_file = pki.path("client-key.pem");
    let error = tls::server_config(&files).unwrap_err().to_string();
    assert!(error.starts_with("tls_key_file:"), "{error}");
    let mut files = pki.server_files(false);
    files.cert_file = pki.path("missing.pem");
    let error = tls::server_config(&files).unwrap_err().to_string();
    assert!(error.starts_with("tls_cert_file:"), "{error}");
    let mut files = pki.server_files(true);
    files.client_ca_file = Some(pki.path("server-key.pem"));
    let error = tls::server_config(&files).unwrap_err().to_string();
    assert!(error.starts_with("tls_client_ca_file:"), "{error}");
}

const OPERATOR_TOKEN: &str = "tok-ops.7d3a91c5e08f4b26";

/// Runs `opjournal <args>` and returns (exit code, stdout, stderr).
async fn opjournal(args: &[&str], token: Option<&str>) -> (i32, String, String) {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_opjournal"));
    command
        .args(args)
        .env_remove("OPJOURNAL_SERVER")
        .env_remove("OPJOURNAL_TOKEN");
    if let Some(token) = token {
        command.env("OPJOURNAL_TOKEN", token);
    }
    let output = command.output().await.unwrap();
    (
        output.status.code().unwrap(),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

fn write_config(dir: &Path, pki: &Pki) -> PathBuf {
    let config = format!(
        r#"
tls_cert_file = "{}"
tls_key_file = "{}"
tls_client_ca_file = "{}"

[[tokens]]
name = "operator"
sha256 = "{}"
namespaces = ["*"]
roles = ["admin"]
"#,
        pki.path("server.pem").display(),
        pki.path("server-key.pem").display(),
        pki.path("ca.pem").display(),
        hex::encode(sha2::Sha256::digest(OPERATOR_TOKEN.as_bytes())),
    );
    let path = dir.join("opjournal.toml");
    std::fs::write(&path, config).unwrap();
    path
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_operator_console_reaches_the_server_binary_over_mutual_tls_with_a_token(pool: PgPool) {
    let pki = Pki::new();
    let app = TestApp::spawn(pool).await;
    app.begin(PAYMENT_KEY, "create_payment", PAY_817)
        .await
        .unwrap();
    let config = write_config(pki.dir.path(), &pki);
    let config_arg = config.display().to_string();
    let database_url = app.database_url();

    let (code, stdout, stderr) = opjournal(&["check-config", "--config", &config_arg], None).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("valid"), "{stdout}");

    let (mut server, mut lines) = process::spawn_piped(
        tokio::process::Command::new(env!("CARGO_BIN_EXE_opjournal"))
            .args(["serve", "--config", &config_arg, "--listen", "127.0.0.1:0"])
            .args(["--metrics-listen", "127.0.0.1:0"])
            .args(["--database-url", &database_url])
            .env("RUST_LOG", "debug")
            .env_remove("OPJOURNAL_AUTH__TOKENS")
            .stderr(Stdio::piped()),
    );
    // Drained all along: a full pipe would block the server's logging.
    let mut stderr_pipe = server.stderr.take().unwrap();
    let log = tokio::spawn(async move {
        let mut log = String::new();
        stderr_pipe.read_to_string(&mut log).await.unwrap();
        log
    });
    let server_url = format!(
        "https://{}",
        process::announced(&mut lines, "opjournal listening on").await
    );

    let ca = pki.path("ca.pem").display().to_string();
    let cert = pki.path("client.pem").display().to_string();
    let key = pki.path("client-key.pem").display().to_string();
    let tls_args = [
        "--server",
        server_url.as_str(),
        "--ca-file",
        ca.as_str(),
        "--cert-file",
        cert.as_str(),
        "--key-file",
        key.as_str(),
    ];
    let show = |token| {
        let mut args = vec!["show", PAYMENT_KEY, "--json"];
        args.extend(tls_args);
        async move { opjournal(&args, token).await }
    };

    // Certificate and token: the operation and its history.
    let (code, stdout, stderr) = show(Some(OPERATOR_TOKEN)).await;
    assert_eq!(code, 0, "{stderr}");
    let document: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(document["operation"]["operation_key"], PAYMENT_KEY);
    assert_eq!(document["operation"]["status"], "in_progress");

    // Without the token: refused by the server, with the reason.
    let (code, _, stderr) = show(None).await;
    assert_eq!(code, 2);
    assert!(
        stderr.contains("UNAUTHENTICATED MISSING_CREDENTIALS"),
        "{stderr}"
    );

    // Without a client certificate: no connection at all (how it ends depends on when the
    // server's alert arrives; it never reaches the journal).
    let (code, stdout, stderr) = opjournal(
        &[
            "show",
            PAYMENT_KEY,
            "--server",
            &server_url,
            "--ca-file",
            &ca,
        ],
        Some(OPERATOR_TOKEN),
    )
    .await;
    assert_ne!(code, 0);
    assert!(
        stdout.is_empty() && stderr.starts_with("error: "),
        "{stderr}"
    );
    assert!(!stderr.contains("MISSING_CREDENTIALS"), "{stderr}");

    // TLS files with a plaintext URL are a usage mistake, named before any call.
    let (code, _, stderr) = opjournal(
        &[
            "show",
            PAYMENT_KEY,
            "--server",
            "http://127.0.0.1:1",
            "--ca-file",
            &ca,
        ],
        None,
    )
    .await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("need an https:// server"), "{stderr}");

    server.start_kill().unwrap();
    server.wait().await.unwrap();
    let log = log.await.unwrap();
    assert!(log.contains("bearer-token authentication on"), "{log}");
    assert!(!log.contains(OPERATOR_TOKEN), "the token was logged");
}

/// The first certificate of a PEM file, DER.
fn first_certificate(path: &Path) -> Vec<u8> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    CertificateDer::pem_file_iter(path)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .to_vec()
}

/// The certificate the server at `addr` presents to a new connection (trusting `ca.pem`).
async fn served_certificate(pki: &Pki, addr: std::net::SocketAddr) -> Vec<u8> {
    use rustls::pki_types::ServerName;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(first_certificate(&pki.path("ca.pem")).into())
        .unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let stream = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let (_, session) = stream.get_ref();
    assert_eq!(session.alpn_protocol(), Some(&b"h2"[..]));
    session.peer_certificates().unwrap()[0].to_vec()
}

#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn a_renewed_certificate_is_served_without_a_restart(pool: PgPool) {
    let pki = Pki::new();
    let server_tls = tls::server_config(&pki.server_files(false))
        .unwrap()
        .reload_every(Duration::from_millis(100));
    let handle = server_tls.clone();
    let app = TestApp::spawn_with_options(
        pool,
        SpawnOptions {
            tls: Some(server_tls),
            client_tls: Some(pki.client("ca", None)),
            ..SpawnOptions::default()
        },
    )
    .await;
    let url = format!("https://{}", app.addr);
    let first = first_certificate(&pki.path("server.pem"));
    assert_eq!(served_certificate(&pki, app.addr).await, first);
    call(url.clone(), Some(pki.client("ca", None)))
        .await
        .unwrap();

    // Half a renewal (the new certificate beside the old key) is refused by name, and the
    // server keeps presenting the certificate it has.
    pki.renew_server("renewed");
    let renewed = first_certificate(&pki.path("renewed.pem"));
    assert_ne!(renewed, first);
    std::fs::copy(pki.path("renewed.pem"), pki.path("server.pem")).unwrap();
    let error = handle.reload().unwrap_err().to_string();
    assert!(error.starts_with("tls_key_file:"), "{error}");
    assert_eq!(served_certificate(&pki, app.addr).await, first);

    // The whole renewal: new connections get the new certificate, with no restart.
    std::fs::copy(pki.path("renewed-key.pem"), pki.path("server-key.pem")).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while served_certificate(&pki, app.addr).await != renewed {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the renewed certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!handle.reload().unwrap(), "nothing changed since");
    call(url, Some(pki.client("ca", None))).await.unwrap();
    // The connection made before the renewal still works.
    let status = app
        .journal
        .clone()
        .get_operation(GetOperationRequest {
            namespace: String::new(),
            operation_key: "anything".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound);
}

const CLIENT_TOKEN: &str = "tok-client.4e8b2a61d07c9f35";
const REVIEWER_TOKEN: &str = "tok-reviewer.b19f7c3e0a6d5284";

/// The server binary as the prod overlay runs it: settings from the environment, TLS from
/// mounted files, tokens from a tokens file, health in plaintext on a port of its own.
#[sqlx::test(migrator = "opjournal::store::postgres::MIGRATOR")]
async fn the_server_binary_serves_tls_tokens_from_a_file_and_plaintext_health(pool: PgPool) {
    use opjournal::api::auth::BearerToken;
    use opjournal::proto::ListOperationsForReviewRequest;
    use opjournal::proto::reconciler_client::ReconcilerClient;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

    let pki = Pki::new();
    let app = TestApp::spawn(pool).await;
    let digest = |token: &str| hex::encode(sha2::Sha256::digest(token.as_bytes()));
    let tokens_file = pki.path("tokens.toml");
    std::fs::write(
        &tokens_file,
        format!(
            "[[tokens]]\nname = \"orchestrator\"\nsha256 = \"{}\"\nnamespaces = [\"tenant-a\"]\n\
             roles = [\"client\"]\n\n[[tokens]]\nname = \"reviewer\"\nsha256 = \"{}\"\n\
             namespaces = [\"tenant-a\"]\nroles = [\"reviewer\"]\n",
            digest(CLIENT_TOKEN),
            digest(REVIEWER_TOKEN),
        ),
    )
    .unwrap();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_opjournal"));
    command
        .arg("serve")
        .env_clear()
        .env("OPJOURNAL_SERVER__LISTEN", "127.0.0.1:0")
        .env("OPJOURNAL_SERVER__METRICS_LISTEN", "127.0.0.1:0")
        .env("OPJOURNAL_SERVER__HEALTH_LISTEN", "127.0.0.1:0")
        .env("OPJOURNAL_DATABASE__URL", app.database_url())
        .env("OPJOURNAL_TLS__CERT_FILE", pki.path("server.pem"))
        .env("OPJOURNAL_TLS__KEY_FILE", pki.path("server-key.pem"))
        .env("OPJOURNAL_AUTH__TOKENS_FILE", &tokens_file)
        .env("RUST_LOG", "debug")
        .stderr(Stdio::piped());
    let (mut server, mut lines) = process::spawn_piped(&mut command);
    let mut stderr_pipe = server.stderr.take().unwrap();
    let log = tokio::spawn(async move {
        let mut log = String::new();
        stderr_pipe.read_to_string(&mut log).await.unwrap();
        log
    });
    let addresses = process::announced_all(
        &mut lines,
        &["opjournal listening on", "opjournal health on"],
        Duration::from_secs(30),
    )
    .await;
    let [grpc, health] = <[String; 2]>::try_from(addresses).unwrap();

    // Health in plaintext on its own port, following the database like the main port's.
    let channel = Channel::from_shared(format!("http://{health}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let check = |service: &str| {
        let mut client = HealthClient::new(channel.clone());
        let request = HealthCheckRequest {
            service: service.into(),
        };
        async move { client.check(request).await.unwrap().into_inner().status }
    };
    assert_eq!(check("liveness").await, ServingStatus::Serving as i32);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while check("readiness").await != ServingStatus::Serving as i32 {
        assert!(tokio::time::Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The health port serves nothing else.
    let status = OperationJournalClient::new(channel)
        .get_operation(GetOperationRequest::default())
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unimplemented);
    // The gRPC port speaks TLS only.
    let refused = call(format!("http://{grpc}"), None).await;
    assert!(refused.is_err(), "{refused:?}");

    let tls_channel = Channel::from_shared(format!("https://{grpc}"))
        .unwrap()
        .tls_config(pki.client("ca", None))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let review = |token: Option<&str>| {
        let request = ListOperationsForReviewRequest {
            namespace: "tenant-a".into(),
            ..Default::default()
        };
        let channel = tls_channel.clone();
        let token = token.map(|t| BearerToken::new(t).unwrap());
        async move {
            match token {
                Some(token) => ReconcilerClient::with_interceptor(channel, token)
                    .list_operations_for_review(request)
                    .await
                    .map(|_| ()),
                None => ReconcilerClient::new(channel)
                    .list_operations_for_review(request)
                    .await
                    .map(|_| ()),
            }
        }
    };
    // Tokens from the file: the reviewer reviews; the client's token may not, and no token
    // gets nowhere.
    review(Some(REVIEWER_TOKEN)).await.unwrap();
    let status = review(Some(CLIENT_TOKEN)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::PermissionDenied);
    assert_eq!(reason(&status), "ROLE_NOT_ALLOWED");
    let status = review(None).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    assert_eq!(reason(&status), "MISSING_CREDENTIALS");

    server.start_kill().unwrap();
    server.wait().await.unwrap();
    let log = log.await.unwrap();
    assert!(log.contains("bearer-token authentication on"), "{log}");
    for secret in [
        CLIENT_TOKEN.to_owned(),
        REVIEWER_TOKEN.to_owned(),
        digest(CLIENT_TOKEN),
        digest(REVIEWER_TOKEN),
    ] {
        assert!(
            !log.contains(&secret),
            "the log shows the tokens file's content"
        );
    }
}
