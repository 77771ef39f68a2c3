//! Ports and addresses on this machine for the servers a test starts.

use std::{fs, net::TcpListener, time::Instant};

use crate::error::Error;

/// This machine's address that pods and kubelets can reach (not loopback,
/// which the kubelet refuses for `--node-ip`): the source address of the
/// default route.
pub fn host_ip() -> Result<String, Error> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").map_err(Error::io("bind", "0.0.0.0:0"))?;
    // Connecting a UDP socket sends nothing; it only picks a route.
    socket
        .connect("192.0.2.1:9")
        .or_else(|_| socket.connect("10.255.255.255:9"))
        .map_err(Error::io("find the host address", "default route"))?;
    let ip = socket
        .local_addr()
        .map_err(Error::io("find the host address", "default route"))?
        .ip();
    if ip.is_loopback() || ip.is_unspecified() {
        return Err(Error::Config(format!("no usable host address (got {ip})")));
    }
    Ok(ip.to_string())
}

/// Picks `N` distinct free loopback ports for servers to listen on.
///
/// The ports come from below the kernel's ephemeral range: a port the kernel
/// hands out for `bind(0)` is also where it puts the source ports of outgoing
/// connections, so between this check and the server's own `bind` a client
/// connection (kubelets, controllers, the test itself) could take it
/// ("address already in use"). Below the range only another listener can.
pub fn free_ports<const N: usize>() -> Result<[u16; N], Error> {
    let (low, high) = listen_range();
    let mut listeners = Vec::with_capacity(N);
    let mut ports = [0; N];
    for port in &mut ports {
        let mut found = None;
        for _ in 0..256 {
            let candidate = low + (random() % u64::from(high - low)) as u16;
            if let Ok(listener) = TcpListener::bind(("127.0.0.1", candidate)) {
                found = Some((candidate, listener));
                break;
            }
        }
        // A crowded range: fall back to the kernel's choice.
        let (chosen, listener) = match found {
            Some(found) => found,
            None => {
                let listener =
                    TcpListener::bind("127.0.0.1:0").map_err(Error::io("bind", "127.0.0.1:0"))?;
                let port = listener
                    .local_addr()
                    .map_err(Error::io("bind", "127.0.0.1:0"))?
                    .port();
                (port, listener)
            }
        };
        *port = chosen;
        // Held until all are chosen, so the `N` ports differ.
        listeners.push(listener);
    }
    Ok(ports)
}

/// The listening ports to pick from: 10000 up to the start of the kernel's
/// ephemeral range (32768 when it cannot be read).
fn listen_range() -> (u16, u16) {
    let start = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<u16>().ok())
        .filter(|start| *start > 12_000)
        .unwrap_or(32_768);
    (10_000, start)
}

/// A random number: each `RandomState` is keyed afresh (per thread, from
/// the OS's randomness, then incremented).
fn random() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(Instant::now())
}

/// Picks one free loopback port.
pub fn free_port() -> Result<u16, Error> {
    Ok(free_ports::<1>()?[0])
}

/// A TCP proxy to `upstream` on a free port of 127.0.0.1 that stops
/// forwarding (holding every connection open) while `frozen` is true;
/// returns the port.
pub async fn freezable_proxy(
    upstream: String,
    frozen: tokio::sync::watch::Receiver<bool>,
) -> Result<u16, Error> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    async fn pipe(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        mut frozen: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut buffer = vec![0u8; 16 * 1024];
        loop {
            let Ok(n) = from.read(&mut buffer).await else {
                return;
            };
            if n == 0 || frozen.wait_for(|f| !*f).await.is_err() {
                return;
            }
            if to.write_all(&buffer[..n]).await.is_err() {
                return;
            }
        }
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(Error::io("bind the proxy", "127.0.0.1:0"))?;
    let port = listener
        .local_addr()
        .map_err(Error::io("read the proxy's address", "127.0.0.1:0"))?
        .port();
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            let Ok(outbound) = tokio::net::TcpStream::connect(&upstream).await else {
                continue;
            };
            let (in_read, in_write) = inbound.into_split();
            let (out_read, out_write) = outbound.into_split();
            tokio::spawn(pipe(in_read, out_write, frozen.clone()));
            tokio::spawn(pipe(out_read, in_write, frozen.clone()));
        }
    });
    Ok(port)
}
