//! Events: the supervisor's unsolicited frames,
//! `{"type":"event","event":NAME,"data":{...}}`, typed (`docs/protocol.md`
//! §7). Every event the supervisor sends has a variant; an event this build
//! does not know (a newer supervisor's), or a known one whose data it cannot
//! read, decodes as [`Event::Other`] and is kept as it came — a peer
//! ignores what it does not know, it never fails on it.
//!
//! `data` is written as a JSON object with its keys in sorted order, exactly
//! as the untyped frames were (`serde_json` maps are sorted), so the bytes on
//! the wire do not depend on this module's field order.

use serde::de::DeserializeOwned;
use serde::ser::SerializeStruct;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use super::turn::TurnEvent;

/// `child.start`: a child was launched (subscribers).
pub const CHILD_START: &str = "child.start";
/// `child.exit`: a child ended (subscribers).
pub const CHILD_EXIT: &str = "child.exit";
/// `model.delta`: streamed text of a `model.complete` (the requesting
/// connection only).
pub const MODEL_DELTA: &str = "model.delta";
/// `turn.delta`: a child's model text as it streams (subscribers).
pub const TURN_DELTA: &str = "turn.delta";
/// `turn.event`: an event of a running turn, reported by its agent child
/// (subscribers).
pub const TURN_EVENT: &str = "turn.event";
/// `supervisor.shutdown`: the supervisor is stopping (every live child
/// channel).
pub const SUPERVISOR_SHUTDOWN: &str = "supervisor.shutdown";
/// `events.lagged`: this subscriber fell behind and missed events.
pub const EVENTS_LAGGED: &str = "events.lagged";

/// An event frame's content: its name and its data.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    ChildStart(ChildStart),
    ChildExit(ChildExit),
    ModelDelta(ModelDelta),
    TurnDelta(TurnDelta),
    TurnEvent(TurnNotice),
    SupervisorShutdown(Shutdown),
    EventsLagged(Lagged),
    /// An event this build does not know, or a known one whose data it
    /// cannot read, as it came.
    Other {
        event: String,
        data: Value,
    },
}

/// `child.start` data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildStart {
    pub child: u64,
    /// The agent id.
    pub agent: String,
    pub role: String,
    pub pid: u32,
}

/// `child.exit` data: the child's row and how it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildExit {
    pub child: u64,
    pub agent: String,
    pub role: String,
    pub pid: u32,
    #[serde(flatten)]
    pub end: ChildEnd,
}

/// How a child ended (`"state"` in `child.exit`). A failure to wait for it
/// is reported as `exited` with code -1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ChildEnd {
    Exited { code: i32 },
    Killed { signal: i32 },
}

impl ChildEnd {
    /// Whether a signal ended it: its own death by one, or one its
    /// launcher relays as a shell does, exiting 128 + the signal
    /// (bubblewrap does; the namespace monitor dies by SIGKILL itself).
    pub fn by_signal(&self) -> bool {
        match *self {
            ChildEnd::Killed { .. } => true,
            ChildEnd::Exited { code } => (129..=128 + 64).contains(&code),
        }
    }
}

impl ChildExit {
    /// The exit code, when it exited.
    pub fn code(&self) -> Option<i32> {
        match self.end {
            ChildEnd::Exited { code } => Some(code),
            ChildEnd::Killed { .. } => None,
        }
    }

    /// The signal that killed it, when one did.
    pub fn signal(&self) -> Option<i32> {
        match self.end {
            ChildEnd::Killed { signal } => Some(signal),
            ChildEnd::Exited { .. } => None,
        }
    }
}

/// `model.delta` data: text of the response to request `request` of this
/// connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelDelta {
    pub request: u64,
    pub text: String,
}

/// `turn.delta` data: model text streamed for a child (`agent` and `child`
/// are null when the request came from the control socket).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnDelta {
    pub agent: Option<String>,
    pub child: Option<u64>,
    pub text: String,
}

/// `turn.event` data: an event of a running turn. `agent` and `child` are
/// the supervisor's record of who reported it; `event` is what the agent
/// child sent, relayed as it came (the supervisor vouches for the sender,
/// not for the content) — read it with [`TurnNotice::turn_event`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnNotice {
    pub agent: String,
    pub child: u64,
    pub conversation: String,
    pub event: Value,
}

impl TurnNotice {
    /// The turn event, when it is one this build can read.
    pub fn turn_event(&self) -> Option<TurnEvent> {
        TurnEvent::deserialize(&self.event).ok()
    }
}

/// `supervisor.shutdown` data: how long children have before SIGTERM turns
/// into SIGKILL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shutdown {
    pub grace_ms: u64,
}

/// `events.lagged` data: how many events were dropped for this subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lagged {
    pub missed: u64,
}

impl Event {
    /// The event's name on the wire.
    pub fn name(&self) -> &str {
        match self {
            Event::ChildStart(_) => CHILD_START,
            Event::ChildExit(_) => CHILD_EXIT,
            Event::ModelDelta(_) => MODEL_DELTA,
            Event::TurnDelta(_) => TURN_DELTA,
            Event::TurnEvent(_) => TURN_EVENT,
            Event::SupervisorShutdown(_) => SUPERVISOR_SHUTDOWN,
            Event::EventsLagged(_) => EVENTS_LAGGED,
            Event::Other { event, .. } => event,
        }
    }

    /// The event's data as it goes on the wire.
    pub fn data(&self) -> Value {
        self.data_value().unwrap_or(Value::Null)
    }

    fn data_value(&self) -> Result<Value, serde_json::Error> {
        match self {
            Event::ChildStart(d) => serde_json::to_value(d),
            Event::ChildExit(d) => serde_json::to_value(d),
            Event::ModelDelta(d) => serde_json::to_value(d),
            Event::TurnDelta(d) => serde_json::to_value(d),
            Event::TurnEvent(d) => serde_json::to_value(d),
            Event::SupervisorShutdown(d) => serde_json::to_value(d),
            Event::EventsLagged(d) => serde_json::to_value(d),
            Event::Other { data, .. } => Ok(data.clone()),
        }
    }

    /// The event a frame names, typed when this build knows it and can read
    /// its data, else [`Event::Other`].
    pub fn from_wire(event: String, data: Value) -> Event {
        fn read<T: DeserializeOwned>(data: &Value) -> Option<T> {
            T::deserialize(data).ok()
        }
        let typed = match event.as_str() {
            CHILD_START => read(&data).map(Event::ChildStart),
            CHILD_EXIT => read(&data).map(Event::ChildExit),
            MODEL_DELTA => read(&data).map(Event::ModelDelta),
            TURN_DELTA => read(&data).map(Event::TurnDelta),
            TURN_EVENT => read(&data).map(Event::TurnEvent),
            SUPERVISOR_SHUTDOWN => read(&data).map(Event::SupervisorShutdown),
            EVENTS_LAGGED => read(&data).map(Event::EventsLagged),
            _ => None,
        };
        typed.unwrap_or(Event::Other { event, data })
    }
}

impl Serialize for Event {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let data = self.data_value().map_err(serde::ser::Error::custom)?;
        let mut s = serializer.serialize_struct("Event", 2)?;
        s.serialize_field("event", self.name())?;
        s.serialize_field("data", &data)?;
        s.end()
    }
}

impl<'de> Deserialize<'de> for Event {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Wire {
            event: String,
            data: Value,
        }
        let w = Wire::deserialize(deserializer)?;
        Ok(Event::from_wire(w.event, w.data))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::protocol::{ServerFrame, encode};

    /// The frame's line, newline excluded.
    fn line(e: &Event) -> String {
        let bytes = encode(&ServerFrame::Event(e.clone()));
        String::from_utf8_lossy(bytes.strip_suffix(b"\n").unwrap_or(&bytes)).into_owned()
    }

    fn decode(text: &str) -> Event {
        match serde_json::from_str::<ServerFrame>(text) {
            Ok(ServerFrame::Event(e)) => e,
            other => panic!("{text} is not an event frame: {other:?}"),
        }
    }

    /// Each variant is written exactly as `docs/protocol.md` §7 shows it
    /// (and as the untyped frames were: data keys sorted), and reads back.
    #[test]
    fn every_event_keeps_its_wire_form() {
        let cases = [
            (
                Event::ChildStart(ChildStart {
                    child: 8,
                    agent: "agent-1".into(),
                    role: "tool".into(),
                    pid: 17001,
                }),
                r#"{"type":"event","event":"child.start","data":{"agent":"agent-1","child":8,"pid":17001,"role":"tool"}}"#,
            ),
            (
                Event::ChildExit(ChildExit {
                    child: 8,
                    agent: "agent-1".into(),
                    role: "tool".into(),
                    pid: 17001,
                    end: ChildEnd::Exited { code: 0 },
                }),
                r#"{"type":"event","event":"child.exit","data":{"agent":"agent-1","child":8,"code":0,"pid":17001,"role":"tool","state":"exited"}}"#,
            ),
            (
                Event::ChildExit(ChildExit {
                    child: 9,
                    agent: "agent-1".into(),
                    role: "agent".into(),
                    pid: 17002,
                    end: ChildEnd::Killed { signal: 9 },
                }),
                r#"{"type":"event","event":"child.exit","data":{"agent":"agent-1","child":9,"pid":17002,"role":"agent","signal":9,"state":"killed"}}"#,
            ),
            (
                Event::ModelDelta(ModelDelta {
                    request: 10,
                    text: "mock: hi".into(),
                }),
                r#"{"type":"event","event":"model.delta","data":{"request":10,"text":"mock: hi"}}"#,
            ),
            (
                Event::TurnDelta(TurnDelta {
                    agent: Some("agent-1".into()),
                    child: Some(8),
                    text: "Hel".into(),
                }),
                r#"{"type":"event","event":"turn.delta","data":{"agent":"agent-1","child":8,"text":"Hel"}}"#,
            ),
            (
                Event::TurnDelta(TurnDelta {
                    agent: None,
                    child: None,
                    text: "lo".into(),
                }),
                r#"{"type":"event","event":"turn.delta","data":{"agent":null,"child":null,"text":"lo"}}"#,
            ),
            (
                Event::TurnEvent(TurnNotice {
                    agent: "agent-1".into(),
                    child: 8,
                    conversation: "default".into(),
                    event: json!({"type": "step", "n": 1}),
                }),
                r#"{"type":"event","event":"turn.event","data":{"agent":"agent-1","child":8,"conversation":"default","event":{"n":1,"type":"step"}}}"#,
            ),
            (
                Event::SupervisorShutdown(Shutdown { grace_ms: 3000 }),
                r#"{"type":"event","event":"supervisor.shutdown","data":{"grace_ms":3000}}"#,
            ),
            (
                Event::EventsLagged(Lagged { missed: 17 }),
                r#"{"type":"event","event":"events.lagged","data":{"missed":17}}"#,
            ),
        ];
        for (event, wire) in cases {
            assert_eq!(line(&event), wire);
            assert_eq!(decode(wire), event, "{wire}");
        }
    }

    /// The frame the supervisor used to build — the untyped event variant,
    /// with the `json!` data of its construction sites — and the typed one
    /// are the same bytes.
    #[test]
    fn typed_events_match_the_untyped_frames() {
        #[derive(Serialize)]
        #[serde(tag = "type", rename_all = "snake_case")]
        enum Untyped {
            Event { event: String, data: Value },
        }
        let untyped = |event: &str, data: Value| {
            let bytes = encode(&Untyped::Event {
                event: event.into(),
                data,
            });
            String::from_utf8_lossy(bytes.strip_suffix(b"\n").unwrap_or(&bytes)).into_owned()
        };
        // The reaper's data: the row, extended with the end state's fields.
        let mut data = json!({ "child": 3, "agent": "a", "role": "tool", "pid": 42 });
        if let Some(o) = data.as_object_mut() {
            o.insert("state".into(), json!("killed"));
            o.insert("signal".into(), json!(11));
        }
        let exit = ChildExit {
            child: 3,
            agent: "a".into(),
            role: "tool".into(),
            pid: 42,
            end: ChildEnd::Killed { signal: 11 },
        };
        assert_eq!(line(&Event::ChildExit(exit)), untyped("child.exit", data));
        let notice = TurnNotice {
            agent: "a".into(),
            child: 3,
            conversation: "c".into(),
            event: json!({"type": "tool_call", "name": "Bash"}),
        };
        assert_eq!(
            line(&Event::TurnEvent(notice)),
            untyped(
                "turn.event",
                json!({ "agent": "a", "child": 3, "conversation": "c",
                        "event": {"type": "tool_call", "name": "Bash"} })
            )
        );
        assert_eq!(
            line(&Event::TurnDelta(TurnDelta {
                agent: None,
                child: None,
                text: "t".into()
            })),
            untyped(
                "turn.delta",
                json!({ "agent": null, "child": null, "text": "t" })
            )
        );
    }

    /// Forward compatibility: an event this build does not know decodes,
    /// and goes back out unchanged.
    #[test]
    fn unknown_events_still_decode() {
        let wire = r#"{"type":"event","event":"memory.merged","data":{"agent":"a","commit":"3f0c","extra":[1,2]}}"#;
        let e = decode(wire);
        assert_eq!(
            e,
            Event::Other {
                event: "memory.merged".into(),
                data: json!({"agent": "a", "commit": "3f0c", "extra": [1, 2]}),
            }
        );
        assert_eq!(e.name(), "memory.merged");
        assert_eq!(line(&e), wire);
        // Data that is not an object is fine too.
        assert!(matches!(
            decode(r#"{"type":"event","event":"x","data":null}"#),
            Event::Other {
                data: Value::Null,
                ..
            }
        ));
    }

    /// A known event whose data this build cannot read is kept, not
    /// refused; new fields in a known event's data are ignored.
    #[test]
    fn unreadable_or_extended_data_still_decodes() {
        let odd = r#"{"type":"event","event":"child.exit","data":{"child":"eight"}}"#;
        assert_eq!(
            decode(odd),
            Event::Other {
                event: "child.exit".into(),
                data: json!({"child": "eight"}),
            }
        );
        let extended =
            r#"{"type":"event","event":"model.delta","data":{"request":1,"text":"a","tokens":3}}"#;
        assert_eq!(
            decode(extended),
            Event::ModelDelta(ModelDelta {
                request: 1,
                text: "a".into()
            })
        );
    }

    /// `turn.event` relays the child's event as it came; readers get the
    /// typed event when it is one.
    #[test]
    fn turn_notices_read_their_event() {
        let mut notice = TurnNotice {
            agent: "a".into(),
            child: 1,
            conversation: "default".into(),
            event: json!({"type": "step", "n": 2}),
        };
        assert_eq!(notice.turn_event(), Some(TurnEvent::Step { n: 2 }));
        notice.event = json!({"type": "tool_call", "name": "Bash"});
        assert_eq!(notice.turn_event(), None);
    }
}
