//! What every answer carries besides its own fields, and how a runner reads
//! an answer: its envelope (the request's id, `ok`, the worker's own time
//! and how it met the request; a failure's class and message) and, when it
//! went well, its body as the op's answer type.

use std::marker::PhantomData;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value as Json;

use super::lines::Met;

/// The classes of failure a worker answers (`"ok": false`). The runner
/// records them as the job's failure; `crash` and `timeout` are the
/// runner's own findings, never sent by a worker, and neither are `mismatch`
/// or `nan` (a failed comparison is an ok answer with `"passed": false`),
/// though a runner reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    CompileError,
    OutOfResources,
    LaunchError,
    Mismatch,
    Nan,
    BadRequest,
    ProblemError,
}

impl FailureKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::CompileError => "compile_error",
            FailureKind::OutOfResources => "out_of_resources",
            FailureKind::LaunchError => "launch_error",
            FailureKind::Mismatch => "mismatch",
            FailureKind::Nan => "nan",
            FailureKind::BadRequest => "bad_request",
            FailureKind::ProblemError => "problem_error",
        }
    }
}

/// The fields every answer carries, read whatever else it holds. Read
/// leniently: a worker that predates a field leaves it out.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
pub struct Envelope {
    /// The request's id (null in the answer to a line with none).
    pub id: Option<u64>,
    #[serde(default)]
    pub ok: bool,
    /// The worker's time on the request, from having read its line to
    /// having the answer encoded; always the answer's last field.
    pub worker_us: Option<f64>,
    /// The native worker's wait between its previous answer and this
    /// request's line (absent on its first).
    pub idle_us: Option<f64>,
    /// When the worker read the request, on the host's monotonic clock.
    pub at_ns: Option<u64>,
    /// How the worker met the request: waiting for it spinning, asleep, or
    /// with the line already there.
    #[schemars(with = "Option<Met>")]
    pub met: Option<String>,
    /// A failed answer's class ([`FailureKind`]).
    #[schemars(with = "Option<FailureKind>")]
    pub class: Option<String>,
    pub message: Option<String>,
}

/// An answer as a call reads it: the envelope's fields, whatever else it
/// holds, parsed from the answer's line.
pub trait Answer: Sized {
    /// Reads the answer's line.
    fn parse(line: &str) -> serde_json::Result<Self>;
    fn id(&self) -> Option<u64>;
    fn ok(&self) -> bool;
    fn worker_us(&self) -> Option<f64>;
    fn worker_met(&self) -> Option<&str>;
    /// The worker's wait between its previous answer and this request
    /// (workers that say: the native worker's `idle_us`).
    fn worker_idle_us(&self) -> Option<f64>;
    /// When the worker read this request, on the host's monotonic clock
    /// (`at_ns`; workers that say), so a trace can place the worker's own
    /// time inside the round trip.
    fn worker_at_ns(&self) -> Option<u64>;
    /// A failed answer's failure class and message.
    fn class(&self) -> Option<&str>;
    fn message(&self) -> Option<&str>;
}

impl Answer for Json {
    fn parse(line: &str) -> serde_json::Result<Json> {
        serde_json::from_str(line)
    }
    fn id(&self) -> Option<u64> {
        self.get("id").and_then(Json::as_u64)
    }
    fn ok(&self) -> bool {
        self.get("ok").and_then(Json::as_bool) == Some(true)
    }
    fn worker_us(&self) -> Option<f64> {
        self.get("worker_us").and_then(Json::as_f64)
    }
    fn worker_met(&self) -> Option<&str> {
        self.get("met").and_then(Json::as_str)
    }
    fn worker_idle_us(&self) -> Option<f64> {
        self.get("idle_us").and_then(Json::as_f64)
    }
    fn worker_at_ns(&self) -> Option<u64> {
        self.get("at_ns").and_then(Json::as_u64)
    }
    fn class(&self) -> Option<&str> {
        self.get("class").and_then(Json::as_str)
    }
    fn message(&self) -> Option<&str> {
        self.get("message").and_then(Json::as_str)
    }
}

/// An answer read as its op's type: the envelope, and the body where the
/// answer is ok. The line is read twice, once for each, with no JSON tree
/// in between (the native worker's calls, which come once or twice a job):
/// an ok answer whose body does not fit its type does not parse.
#[derive(Debug)]
pub struct Answered<T> {
    pub envelope: Envelope,
    body: Option<T>,
}

impl<T> Answered<T> {
    /// The body of an ok answer; `None` for a failed one.
    pub fn into_body(self) -> Option<T> {
        self.body
    }
}

impl<T: DeserializeOwned> Answer for Answered<T> {
    fn parse(line: &str) -> serde_json::Result<Answered<T>> {
        let envelope: Envelope = serde_json::from_str(line)?;
        let body = if envelope.ok {
            Some(serde_json::from_str(line)?)
        } else {
            None
        };
        Ok(Answered { envelope, body })
    }
    fn id(&self) -> Option<u64> {
        self.envelope.id
    }
    fn ok(&self) -> bool {
        self.envelope.ok
    }
    fn worker_us(&self) -> Option<f64> {
        self.envelope.worker_us
    }
    fn worker_met(&self) -> Option<&str> {
        self.envelope.met.as_deref()
    }
    fn worker_idle_us(&self) -> Option<f64> {
        self.envelope.idle_us
    }
    fn worker_at_ns(&self) -> Option<u64> {
        self.envelope.at_ns
    }
    fn class(&self) -> Option<&str> {
        self.envelope.class.as_deref()
    }
    fn message(&self) -> Option<&str> {
        self.envelope.message.as_deref()
    }
}

/// A part of an answer read on its own, after the rest: one that does not
/// fit its type fails that part (a check's batches), not the whole answer
/// (the check's verdict). Kept as its JSON text until read.
#[derive(Debug, Clone)]
pub struct Deferred<T> {
    raw: Box<RawValue>,
    of: PhantomData<T>,
}

impl<T: Serialize> Deferred<T> {
    /// The part as the worker writes it.
    pub fn new(value: &T) -> Deferred<T> {
        Deferred {
            raw: serde_json::value::to_raw_value(value).expect("an answer serialises"),
            of: PhantomData,
        }
    }
}

impl<T: DeserializeOwned> Deferred<T> {
    /// The part read as its type.
    pub fn read(&self) -> serde_json::Result<T> {
        serde_json::from_str(self.raw.get())
    }
}

impl<T> Serialize for Deferred<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.raw.serialize(s)
    }
}

impl<'de, T> Deserialize<'de> for Deferred<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Deferred<T>, D::Error> {
        Ok(Deferred {
            raw: Box::<RawValue>::deserialize(d)?,
            of: PhantomData,
        })
    }
}

impl<T: JsonSchema> JsonSchema for Deferred<T> {
    fn schema_name() -> String {
        T::schema_name()
    }
    fn schema_id() -> std::borrow::Cow<'static, str> {
        T::schema_id()
    }
    fn json_schema(gen: &mut schemars::gen::SchemaGenerator) -> schemars::schema::Schema {
        T::json_schema(gen)
    }
    fn is_referenceable() -> bool {
        T::is_referenceable()
    }
}

/// An answer with nothing of its own (`release`, `shutdown`), and the body
/// of a request with no fields.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct Empty {}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    struct Body {
        n: u32,
    }

    #[test]
    fn an_answer_reads_its_envelope_and_an_ok_ones_body() {
        let line = r#"{"n":3,"id":7,"ok":true,"at_ns":12,"met":"ready","worker_us":4.5}"#;
        let a = Answered::<Body>::parse(line).unwrap();
        assert_eq!((a.id(), a.ok(), a.worker_us()), (Some(7), true, Some(4.5)));
        assert_eq!(
            (a.worker_met(), a.worker_at_ns()),
            (Some("ready"), Some(12))
        );
        assert_eq!(a.into_body().unwrap().n, 3);
        // A failure has no body to read.
        let failed = r#"{"id":8,"ok":false,"class":"launch_error","message":"fault"}"#;
        let a = Answered::<Body>::parse(failed).unwrap();
        assert_eq!(
            (a.class(), a.message()),
            (Some("launch_error"), Some("fault"))
        );
        assert!(a.into_body().is_none());
        // An ok answer whose body does not fit is not an answer; nor is one
        // with no `ok`, a success.
        assert!(Answered::<Body>::parse(r#"{"id":9,"ok":true,"n":"x"}"#).is_err());
        assert!(!Answered::<Body>::parse(r#"{"id":9}"#).unwrap().ok());
    }

    #[test]
    fn a_deferred_part_is_read_on_its_own() {
        #[derive(Deserialize)]
        struct Outer {
            part: Deferred<Vec<u32>>,
        }
        let outer: Outer = serde_json::from_str(r#"{"part":[1,2]}"#).unwrap();
        assert_eq!(outer.part.read().unwrap(), vec![1, 2]);
        let unfit: Outer = serde_json::from_str(r#"{"part":"x"}"#).unwrap();
        assert!(unfit.part.read().is_err());
        let written = Deferred::new(&vec![3u32]);
        assert_eq!(serde_json::to_string(&written).unwrap(), "[3]");
    }
}
