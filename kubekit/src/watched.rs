//! One watch of a kind, shared: a reflector [`Store`] kept current, a change
//! signal, and any number of event streams fed from that one watch.
//!
//! ```text
//!                        ┌─> Store (updated first)
//! list+watch ─ backoff ──┼─> change signal (bumped after the store)
//!                        └─> events() / touched() of each subscriber
//! ```
//!
//! kube-runtime's own shared reflector (`reflector::store_shared`) is not
//! enough here: its subscribers hear of applied objects only (never of a
//! deletion, which the lifecycle controllers act on), and one that joins
//! late starts from the next change without the objects already listed. A
//! subscriber of a [`Watched`] gets every event in order, a late one first
//! a list made of the store, so it sees what a watch of its own would have
//! shown; the only cost is a channel per subscriber instead of a request.
//!
//! Each channel holds at most [`BUFFER`] events. A subscriber that falls
//! that far behind is not waited for (the watch serves every subscriber)
//! and does not grow without bound: it misses events until it has read
//! what it has, then gets a fresh list made of the store, as a watch of its
//! own gets after the API server expired its place (HTTP 410).

use std::{
    fmt::Debug,
    future::Future,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering},
    },
    task::Poll,
};

use futures::{Stream, StreamExt};
use kube::{
    Api, Resource,
    runtime::{
        WatchStreamExt,
        reflector::{Store, store::Writer},
        watcher::{self, Event},
    },
};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};

/// Events a subscriber's channel holds before it is deemed behind.
pub const BUFFER: usize = 4096;

/// What a kind must be to be watched here (every Kubernetes or Tessera
/// object type).
pub trait Watchable:
    Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static
{
}

impl<K> Watchable for K where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static
{
}

/// A watch to start: what to watch, and which change signal to bump.
#[derive(Debug)]
pub struct Watch<K> {
    api: Api<K>,
    config: watcher::Config,
    changes: watch::Sender<u64>,
    prune: Option<fn(&mut K)>,
}

impl<K: Watchable> Watch<K> {
    /// A watch of what `api` reaches, narrowed by `config`'s selectors.
    pub fn new(api: Api<K>, config: watcher::Config) -> Self {
        Self {
            api,
            config,
            changes: watch::channel(0).0,
            prune: None,
        }
    }

    /// Shrinks each object before it is stored or handed on, to what its
    /// readers use: a store of every Pod of a large cluster holds tens of
    /// thousands. `metadata.managedFields` is dropped from every object
    /// whether or not this is set (no reader needs it, and server-side
    /// apply makes it the bulk of a small object).
    pub fn prune(mut self, prune: fn(&mut K)) -> Self {
        self.prune = Some(prune);
        self
    }

    /// Bumps `changes` after each event reaches the store (several watches
    /// may share one signal), instead of a signal of its own.
    pub fn signal(mut self, changes: &watch::Sender<u64>) -> Self {
        self.changes = changes.clone();
        self
    }

    /// Starts the watch on a task of its own that runs as long as the
    /// runtime does.
    pub fn spawn(self) -> Watched<K> {
        let (watched, run) = self.start();
        tokio::spawn(run);
        watched
    }

    /// The handle, and the future that runs the watch (retrying with
    /// kube-runtime's default backoff): the watch stops when the future is
    /// dropped, and every subscriber's stream then ends.
    pub fn start(self) -> (Watched<K>, impl Future<Output = ()> + Send + 'static) {
        let Self {
            api,
            config,
            changes,
            prune,
        } = self;
        let (watched, mut writer) = Watched::unstarted(&changes);
        // Moved into the future, so dropped with it even if never polled.
        let hub = Hangup(watched.hub.clone());
        let run = async move {
            let selectors = (config.label_selector.clone(), config.field_selector.clone());
            let mut events = watcher::watcher(api, config)
                .default_backoff()
                .modify(move |object: &mut K| {
                    object.meta_mut().managed_fields = None;
                    if let Some(prune) = prune {
                        prune(object);
                    }
                })
                .boxed();
            while let Some(event) = events.next().await {
                match event {
                    Ok(event) => {
                        lock(&hub.0).deliver(&mut writer, event);
                        changes.send_modify(|n| *n = n.wrapping_add(1));
                    }
                    Err(error) => tracing::warn!(
                        %error,
                        kind = %K::kind(&()),
                        labels = selectors.0.as_deref().unwrap_or_default(),
                        fields = selectors.1.as_deref().unwrap_or_default(),
                        "watch failed; retrying"
                    ),
                }
            }
        };
        (watched, run)
    }
}

/// A running watch of `K`; clones share it.
#[derive(Clone)]
pub struct Watched<K: Watchable> {
    store: Store<K>,
    changes: watch::Receiver<u64>,
    hub: Arc<Mutex<Hub<K>>>,
}

impl<K: Watchable> std::fmt::Debug for Watched<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watched")
            .field("kind", &K::kind(&()))
            .field("objects", &self.store.len())
            .finish_non_exhaustive()
    }
}

impl<K: Watchable> Watched<K> {
    /// A handle and the writer of its store, before any event.
    fn unstarted(changes: &watch::Sender<u64>) -> (Self, Writer<K>) {
        let writer = Writer::<K>::default();
        let hub = Hub {
            store: writer.as_reader(),
            subscribers: Vec::new(),
            listing: false,
            listed: false,
        };
        let watched = Self {
            store: writer.as_reader(),
            changes: changes.subscribe(),
            hub: Arc::new(Mutex::new(hub)),
        };
        (watched, writer)
    }

    /// The objects as last seen (updated before anyone hears of a change).
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// A receiver whose value changes after each event reaches the store.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.clone()
    }

    /// Every event from now on, in order, as a watch of its own would show
    /// them: a subscriber that joins after a list has completed first gets
    /// one made of the store (`Init`, `InitApply` of each object,
    /// `InitDone`); one that joins during a list gets the whole list when
    /// it completes.
    ///
    /// A subscriber more than [`BUFFER`] events behind misses events until
    /// it has read those it has, then gets a list made of the store (the
    /// objects as they are by then; deletions meanwhile show as absences).
    pub fn events(&self) -> impl Stream<Item = Event<K>> + Send + 'static {
        let (tx, mut rx) = mpsc::channel(BUFFER);
        let behind = Arc::new(AtomicBool::new(false));
        lock(&self.hub).subscribe(tx, behind.clone());
        let store = self.store.clone();
        let mut relist: Relist<K> = Box::new(std::iter::empty());
        futures::stream::poll_fn(move |cx| {
            if let Some(event) = relist.next() {
                return Poll::Ready(Some(event));
            }
            match rx.poll_recv(cx) {
                Poll::Pending if behind.load(Ordering::SeqCst) => {
                    // Caught up with what was kept: the hub sends again from
                    // now on, and the list covers what it dropped (an event
                    // both in the list and sent is seen twice, never lost).
                    behind.store(false, Ordering::SeqCst);
                    relist = relist_of(&store);
                    Poll::Ready(relist.next())
                }
                other => other,
            }
        })
    }

    /// The objects [`Watched::events`] touches (applied, listed or
    /// deleted), as `Controller::for_stream` and `watches_stream` take them.
    pub fn touched(&self) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static {
        self.events().filter_map(|event| {
            std::future::ready(match event {
                Event::Apply(object) | Event::InitApply(object) | Event::Delete(object) => {
                    Some(Ok(object))
                }
                Event::Init | Event::InitDone => None,
            })
        })
    }
}

/// The subscribers of one watch, and where its list stands.
struct Hub<K: Watchable> {
    store: Store<K>,
    subscribers: Vec<Subscriber<K>>,
    /// Between `Init` and `InitDone`.
    listing: bool,
    /// A list has completed: the store holds what it listed.
    listed: bool,
}

struct Subscriber<K> {
    events: mpsc::Sender<Event<K>>,
    /// Joined during a list: hears nothing until the list is done, then
    /// all of it at once.
    waiting: bool,
    /// Its channel was full: it hears nothing until it has read what it
    /// has and made itself a list of the store (which clears this).
    behind: Arc<AtomicBool>,
}

impl<K> Subscriber<K> {
    /// Sends `event` unless the subscriber is behind; a full channel puts
    /// it behind.
    fn send(&self, event: Event<K>) {
        if self.behind.load(Ordering::SeqCst) {
            return;
        }
        if let Err(mpsc::error::TrySendError::Full(_)) = self.events.try_send(event) {
            self.behind.store(true, Ordering::SeqCst);
        }
    }
}

impl<K: Watchable> Hub<K> {
    fn subscribe(&mut self, events: mpsc::Sender<Event<K>>, behind: Arc<AtomicBool>) {
        let waiting = self.listing;
        let subscriber = Subscriber {
            events,
            waiting,
            behind,
        };
        if self.listed && !waiting {
            list_from(&self.store, &subscriber);
            subscriber.send(Event::InitDone);
        }
        self.subscribers.push(subscriber);
    }

    /// Applies `event` to the store, then passes it on: under the hub's
    /// lock, so a subscriber joining meanwhile gets all of it or none.
    fn deliver(&mut self, writer: &mut Writer<K>, event: Event<K>) {
        writer.apply_watcher_event(&event);
        self.subscribers.retain(|s| !s.events.is_closed());
        match &event {
            Event::Init => self.listing = true,
            Event::InitDone => {
                self.listing = false;
                self.listed = true;
                // The store holds the completed list now; the InitDone that
                // ends it is the one passed on below.
                for subscriber in self.subscribers.iter_mut().filter(|s| s.waiting) {
                    subscriber.waiting = false;
                    list_from(&self.store, subscriber);
                }
            }
            Event::Apply(_) | Event::InitApply(_) | Event::Delete(_) => {}
        }
        let hearing: Vec<_> = self.subscribers.iter().filter(|s| !s.waiting).collect();
        if let Some((last, others)) = hearing.split_last() {
            for subscriber in others {
                subscriber.send(event.clone());
            }
            last.send(event);
        }
    }
}

/// `Init` and an `InitApply` of each object in `store`, each object cloned
/// as the iterator reaches it.
fn list_of<K: Watchable>(store: &Store<K>) -> impl Iterator<Item = Event<K>> + use<K> {
    std::iter::once(Event::Init).chain(
        store
            .state()
            .into_iter()
            .map(|object| Event::InitApply((*object).clone())),
    )
}

/// Sends [`list_of`] `store` to `to`, until its channel is full (an object
/// is cloned only to be sent).
fn list_from<K: Watchable>(store: &Store<K>, to: &Subscriber<K>) {
    for event in list_of(store) {
        if to.behind.load(Ordering::SeqCst) {
            return;
        }
        to.send(event);
    }
}

/// A list made of a store for a subscriber that fell behind ([`list_of`],
/// then `InitDone`), handed out one event at a time: each object is cloned
/// when it is read. Cloning them all into a queue up front held 45,000 pods
/// twice over (and the queue's capacity for good): 500 MB of the
/// controller's memory at 5,000 nodes.
type Relist<K> = Box<dyn Iterator<Item = Event<K>> + Send>;

/// [`Relist`] of `store` as it is now.
fn relist_of<K: Watchable>(store: &Store<K>) -> Relist<K> {
    Box::new(list_of(store).chain(std::iter::once(Event::InitDone)))
}

fn lock<K: Watchable>(hub: &Mutex<Hub<K>>) -> MutexGuard<'_, Hub<K>> {
    hub.lock().unwrap_or_else(|e| e.into_inner())
}

/// Ends every subscriber's stream when the watch stops.
struct Hangup<K: Watchable>(Arc<Mutex<Hub<K>>>);

impl<K: Watchable> Drop for Hangup<K> {
    fn drop(&mut self) {
        lock(&self.0).subscribers.clear();
    }
}

#[cfg(test)]
mod tests;
