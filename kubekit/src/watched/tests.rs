//! What subscribers of one watch see, fed by hand (no API server).

use futures::FutureExt;
use k8s_openapi::api::core::v1::ConfigMap;

use super::*;

fn object(name: &str) -> ConfigMap {
    let mut object = ConfigMap::default();
    object.metadata.name = Some(name.to_owned());
    object.metadata.namespace = Some("d".to_owned());
    object
}

/// What a stream has ready now, as `kind:name`.
fn drain(stream: &mut (impl Stream<Item = Event<ConfigMap>> + Unpin)) -> Vec<String> {
    let mut seen = Vec::new();
    while let Some(Some(event)) = stream.next().now_or_never() {
        let name = |o: &ConfigMap| o.metadata.name.clone().unwrap_or_default();
        seen.push(match event {
            Event::Init => "Init".to_owned(),
            Event::InitApply(o) => format!("InitApply:{}", name(&o)),
            Event::InitDone => "InitDone".to_owned(),
            Event::Apply(o) => format!("Apply:{}", name(&o)),
            Event::Delete(o) => format!("Delete:{}", name(&o)),
        });
    }
    seen
}

struct Fixture {
    watched: Watched<ConfigMap>,
    writer: Writer<ConfigMap>,
}

impl Fixture {
    fn new() -> Self {
        let (watched, writer) = Watched::unstarted(&watch::channel(0).0);
        Self { watched, writer }
    }

    fn deliver(&mut self, events: Vec<Event<ConfigMap>>) {
        for event in events {
            lock(&self.watched.hub).deliver(&mut self.writer, event);
        }
    }
}

fn list(names: &[&str]) -> Vec<Event<ConfigMap>> {
    let mut events = vec![Event::Init];
    events.extend(names.iter().map(|n| Event::InitApply(object(n))));
    events.push(Event::InitDone);
    events
}

#[test]
fn every_subscriber_hears_every_event_in_order_deletions_included() {
    let mut fixture = Fixture::new();
    let mut first = Box::pin(fixture.watched.events());
    let mut second = Box::pin(fixture.watched.events());
    fixture.deliver(list(&["a", "b"]));
    fixture.deliver(vec![Event::Apply(object("c")), Event::Delete(object("a"))]);
    let expected = [
        "Init",
        "InitApply:a",
        "InitApply:b",
        "InitDone",
        "Apply:c",
        "Delete:a",
    ];
    assert_eq!(drain(&mut first), expected);
    assert_eq!(drain(&mut second), expected);
    assert_eq!(fixture.watched.store().len(), 2, "b and c");
}

#[test]
fn a_late_subscriber_starts_with_a_list_made_of_the_store() {
    let mut fixture = Fixture::new();
    fixture.deliver(list(&["a"]));
    fixture.deliver(vec![Event::Apply(object("b"))]);
    let mut late = Box::pin(fixture.watched.events());
    let mut seen = drain(&mut late);
    seen[1..3].sort();
    assert_eq!(seen, ["Init", "InitApply:a", "InitApply:b", "InitDone"]);
    fixture.deliver(vec![Event::Delete(object("a"))]);
    assert_eq!(drain(&mut late), ["Delete:a"]);
}

#[test]
fn a_subscriber_joining_during_a_relist_gets_it_whole_when_it_is_done() {
    let mut fixture = Fixture::new();
    fixture.deliver(list(&["old"]));
    fixture.deliver(vec![Event::Init, Event::InitApply(object("a"))]);
    let mut joiner = Box::pin(fixture.watched.events());
    assert!(
        drain(&mut joiner).is_empty(),
        "nothing before the list is done"
    );
    fixture.deliver(vec![Event::InitApply(object("b")), Event::InitDone]);
    let mut seen = drain(&mut joiner);
    seen[1..3].sort();
    assert_eq!(seen, ["Init", "InitApply:a", "InitApply:b", "InitDone"]);
}

#[test]
fn touched_objects_include_deleted_ones() {
    let mut fixture = Fixture::new();
    let mut touched = Box::pin(fixture.watched.touched());
    fixture.deliver(list(&["a"]));
    fixture.deliver(vec![Event::Delete(object("a"))]);
    let mut names = Vec::new();
    while let Some(Some(Ok(object))) = touched.next().now_or_never() {
        names.push(object.metadata.name.unwrap_or_default());
    }
    assert_eq!(names, ["a", "a"]);
}

#[tokio::test]
async fn streams_end_when_the_watch_stops() {
    // Nothing listens there: the watch would only retry.
    let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
    let api = Api::<ConfigMap>::namespaced(kube::Client::try_from(config).unwrap(), "d");
    let (watched, run) = Watch::new(api, watcher::Config::default()).start();
    let mut events = Box::pin(watched.events());
    drop(run);
    assert!(events.next().await.is_none());
}

#[test]
fn a_subscriber_that_falls_behind_is_not_waited_for_and_relists_when_it_catches_up() {
    let mut fixture = Fixture::new();
    let mut slow = Box::pin(fixture.watched.events());
    let mut quick = Box::pin(fixture.watched.events());
    fixture.deliver(list(&[]));
    assert_eq!(drain(&mut quick), ["Init", "InitDone"]);
    // More than the slow one's channel holds; the quick one keeps up.
    let names: Vec<String> = (0..BUFFER + 10).map(|i| format!("o{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        fixture.deliver(vec![Event::Apply(object(name))]);
        if i % 100 == 0 {
            assert_eq!(drain(&mut quick).len(), if i == 0 { 1 } else { 100 });
        }
    }
    fixture.deliver(vec![Event::Delete(object("o0"))]);
    let seen = drain(&mut slow);
    // What fitted (the list and the first Applies), then a list of the
    // store as it is now: o0 deleted, the last object there.
    assert_eq!(&seen[..2], ["Init", "InitDone"]);
    assert_eq!(seen[2], "Apply:o0");
    let relist = seen[2..].iter().position(|e| e == "Init").unwrap() + 2;
    assert_eq!(relist, BUFFER, "the channel held BUFFER events");
    assert_eq!(seen.last().unwrap(), "InitDone");
    let listed = &seen[relist + 1..seen.len() - 1];
    assert_eq!(listed.len(), BUFFER + 9, "every object but o0");
    assert!(!listed.contains(&"InitApply:o0".to_owned()));
    assert!(listed.contains(&format!("InitApply:o{}", BUFFER + 9)));
    // Caught up: it hears the next event as it happens.
    fixture.deliver(vec![Event::Apply(object("next"))]);
    assert_eq!(drain(&mut slow), ["Apply:next"]);
}
