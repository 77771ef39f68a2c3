//! A TLS-terminating proxy in front of the test's kube-apiserver that
//! injects faults into the answers to pod bindings
//! (`POST /api/v1/namespaces/<ns>/pods/<pod>/binding`), for a component
//! whose API connection is pointed at it (`KUBERNETES_SERVICE_HOST` and
//! `_PORT` of its container): each binding is forwarded to the API server
//! first, so it is committed or refused there, and then its answer is
//! passed on, held back, replaced by a 504 or dropped with the connection,
//! as a slow or failing API server or network would. Everything else is
//! passed through untouched, watches included.
//!
//! It serves the API server's own certificate (the harness's CA signs it
//! for the host's address too) and forwards each connection over one
//! connection of its own to the API server, request by request, so the
//! client's credentials reach the API server as they are.

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Either, Full};
use hyper::{
    Method, Request, Response, StatusCode, body::Incoming, client::conn::http1 as client,
    server::conn::http1 as server, service::service_fn,
};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::broadcast,
    task::JoinHandle,
};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::{error::Error, pki::Pki};

/// What happens to the answer of one binding, after the API server gave it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum BindingFault {
    /// Passed on as it is.
    Pass,
    /// Passed on after this long.
    Delay(Duration),
    /// Replaced by a 504 `Timeout` status, as kube-apiserver answers a
    /// request that outlived its timeout although etcd committed it.
    GatewayTimeout,
    /// Never given: the connection is closed instead.
    Drop,
}

/// A binding the API server committed (201), whatever the client was told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Committed {
    /// `<namespace>/<pod>`.
    pub pod: String,
    /// The node the pod is bound to.
    pub node: String,
    /// What the client got instead of the answer.
    pub fault: BindingFault,
}

/// The shared state of the proxy's connections.
struct State {
    upstream: SocketAddr,
    connector: TlsConnector,
    /// The faults, applied to bindings in turn, round and round.
    plan: Vec<BindingFault>,
    /// How many bindings were seen, and what each fault was done to.
    seen: Mutex<(usize, BTreeMap<BindingFault, u64>)>,
    committed: broadcast::Sender<Committed>,
}

/// The running proxy; stopped when dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    state: Arc<State>,
    task: JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on `ip` (a free port) and forwards to `upstream`, the API
    /// server at `https://127.0.0.1:<port>`, whose certificate the proxy
    /// serves and whose CA it trusts; bindings get `plan`'s faults in turn.
    pub async fn start(
        ip: IpAddr,
        upstream: &str,
        pki: &Pki,
        plan: Vec<BindingFault>,
    ) -> Result<Self, Error> {
        let upstream: SocketAddr = upstream
            .trim_start_matches("https://")
            .parse()
            .map_err(|e| Error::Config(format!("API server address {upstream}: {e}")))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certs = CertificateDer::pem_file_iter(&pki.apiserver_cert)
            .and_then(Iterator::collect::<Result<Vec<_>, _>>)
            .map_err(|e| Error::Config(format!("{}: {e}", pki.apiserver_cert.display())))?;
        let key = PrivateKeyDer::from_pem_file(&pki.apiserver_key)
            .map_err(|e| Error::Config(format!("{}: {e}", pki.apiserver_key.display())))?;
        let mut serving = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .and_then(|b| b.with_no_client_auth().with_single_cert(certs, key))
            .map_err(|e| Error::Config(format!("the proxy's TLS: {e}")))?;
        serving.alpn_protocols = vec![b"http/1.1".to_vec()];
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_file_iter(&pki.ca_cert)
            .map_err(|e| Error::Config(format!("{}: {e}", pki.ca_cert.display())))?
        {
            let ca = ca.map_err(|e| Error::Config(format!("{}: {e}", pki.ca_cert.display())))?;
            roots
                .add(ca)
                .map_err(|e| Error::Config(format!("the harness CA: {e}")))?;
        }
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Config(format!("the proxy's upstream TLS: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let listener = TcpListener::bind((ip, 0))
            .await
            .map_err(Error::io("bind the fault proxy", ip.to_string()))?;
        let addr = listener
            .local_addr()
            .map_err(Error::io("bind the fault proxy", ip.to_string()))?;
        let state = Arc::new(State {
            upstream,
            connector: TlsConnector::from(Arc::new(client)),
            plan: if plan.is_empty() {
                vec![BindingFault::Pass]
            } else {
                plan
            },
            seen: Mutex::default(),
            committed: broadcast::channel(256).0,
        });
        let acceptor = TlsAcceptor::from(Arc::new(serving));
        let serving_state = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, state) = (acceptor.clone(), serving_state.clone());
                tokio::spawn(async move {
                    if let Err(error) = connection(tcp, acceptor, state).await {
                        tracing::debug!(%error, "fault proxy connection ended");
                    }
                });
            }
        });
        Ok(Self { addr, state, task })
    }

    /// Where the proxy listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The bindings the API server commits from now on.
    pub fn committed(&self) -> broadcast::Receiver<Committed> {
        self.state.committed.subscribe()
    }

    /// How many bindings passed through, and how many got each fault.
    pub fn report(&self) -> (usize, BTreeMap<BindingFault, u64>) {
        self.state
            .seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Body = Either<Incoming, Full<Bytes>>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One client connection: TLS, then each request over the connection's own
/// upstream connection.
async fn connection(
    tcp: TcpStream,
    acceptor: TlsAcceptor,
    state: Arc<State>,
) -> Result<(), BoxError> {
    let tls = acceptor.accept(tcp).await?;
    let upstream = TcpStream::connect(state.upstream).await?;
    let name = ServerName::IpAddress(state.upstream.ip().into());
    let upstream = state.connector.connect(name, upstream).await?;
    let (sender, conn) = client::handshake::<_, Body>(TokioIo::new(upstream)).await?;
    tokio::spawn(conn);
    let sender = Arc::new(tokio::sync::Mutex::new(sender));
    server::Builder::new()
        .serve_connection(
            TokioIo::new(tls),
            service_fn(move |request| forward(request, sender.clone(), state.clone())),
        )
        .await?;
    Ok(())
}

/// `<namespace>/<pod>` when `path` is a pod's binding subresource.
fn binding_of(path: &str) -> Option<String> {
    let rest = path.strip_prefix("/api/v1/namespaces/")?;
    let (namespace, rest) = rest.split_once("/pods/")?;
    let pod = rest.strip_suffix("/binding")?;
    (!namespace.contains('/') && !pod.contains('/')).then(|| format!("{namespace}/{pod}"))
}

async fn forward(
    request: Request<Incoming>,
    sender: Arc<tokio::sync::Mutex<client::SendRequest<Body>>>,
    state: Arc<State>,
) -> Result<Response<Body>, BoxError> {
    let binding = (request.method() == Method::POST)
        .then(|| binding_of(request.uri().path()))
        .flatten();
    let Some(pod) = binding else {
        let response = sender
            .lock()
            .await
            .send_request(request.map(Either::Left))
            .await?;
        return Ok(response.map(Either::Left));
    };
    // A binding: read its target, forward it, then apply the next fault.
    let (parts, body) = request.into_parts();
    let body = body.collect().await?.to_bytes();
    let node = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|b| b["target"]["name"].as_str().map(str::to_owned))
        .unwrap_or_default();
    let request = Request::from_parts(parts, Either::Right(Full::new(body)));
    let response = sender.lock().await.send_request(request).await?;
    let fault = {
        let mut seen = state.seen.lock().unwrap_or_else(|e| e.into_inner());
        let fault = state.plan[seen.0 % state.plan.len()];
        seen.0 += 1;
        *seen.1.entry(fault).or_default() += 1;
        fault
    };
    let (parts, body) = response.into_parts();
    let body = body.collect().await?.to_bytes();
    if parts.status == StatusCode::CREATED {
        let _ = state.committed.send(Committed {
            pod: pod.clone(),
            node: node.clone(),
            fault,
        });
    }
    tracing::info!(%pod, %node, status = %parts.status, ?fault, "fault proxy: binding answered");
    match fault {
        BindingFault::Pass => {}
        BindingFault::Delay(wait) => tokio::time::sleep(wait).await,
        BindingFault::Drop => return Err(format!("binding of {pod}: answer dropped").into()),
        BindingFault::GatewayTimeout => {
            let status = serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {},
                "status": "Failure",
                "message": "Timeout: request did not complete within the allotted timeout",
                "reason": "Timeout", "details": {}, "code": 504,
            });
            return Ok(Response::builder()
                .status(StatusCode::GATEWAY_TIMEOUT)
                .header("content-type", "application/json")
                .body(Either::Right(Full::new(Bytes::from(status.to_string()))))?);
        }
    }
    Ok(Response::from_parts(parts, Either::Right(Full::new(body))))
}

#[cfg(test)]
mod tests {
    use super::binding_of;

    #[test]
    fn only_a_pods_binding_subresource_is_a_binding() {
        assert_eq!(
            binding_of("/api/v1/namespaces/default/pods/bare-1/binding").as_deref(),
            Some("default/bare-1")
        );
        for other in [
            "/api/v1/namespaces/default/pods/bare-1",
            "/api/v1/namespaces/default/pods/bare-1/status",
            "/api/v1/namespaces/default/bindings",
            "/api/v1/namespaces/a/b/pods/c/binding",
            "/apis/tessera.dev/v1alpha1/namespaces/default/vgpuallocations",
        ] {
            assert_eq!(binding_of(other), None, "{other}");
        }
    }
}
