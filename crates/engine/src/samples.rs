//! What an expert source counts, in one shape for every reader: `titan bench`'s steady state, `titan run`'s
//! summary and the server's Prometheus `/metrics` read the same samples whatever the source is.

/// One counter or gauge, named as Prometheus names things (the exporter adds the `titan_` prefix).
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: Kind,
    /// What tells series of one name apart (a cluster's node: `("node", "10.0.0.2:7471")`), if anything.
    pub label: Option<(&'static str, String)>,
    pub value: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only ever grows: what happened between two readings is their difference.
    Counter,
    /// A level now.
    Gauge,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        }
    }
}

impl Sample {
    pub fn counter(name: &'static str, help: &'static str, value: f64) -> Sample {
        Sample {
            name,
            help,
            kind: Kind::Counter,
            label: None,
            value,
        }
    }

    pub fn gauge(name: &'static str, help: &'static str, value: f64) -> Sample {
        Sample {
            kind: Kind::Gauge,
            ..Sample::counter(name, help, value)
        }
    }

    pub fn labelled(self, key: &'static str, value: impl Into<String>) -> Sample {
        Sample {
            label: Some((key, value.into())),
            ..self
        }
    }
}

/// The unlabelled counters of `samples`, by name (labelled series are per node, and summed elsewhere).
pub fn counters(samples: &[Sample]) -> std::collections::BTreeMap<&'static str, f64> {
    samples
        .iter()
        .filter(|s| s.kind == Kind::Counter && s.label.is_none())
        .map(|s| (s.name, s.value))
        .collect()
}
