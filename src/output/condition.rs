//! `P/conditions/{group}/{device}` records (docs/conditions.md).

use serde::{Deserialize, Serialize};

use crate::model::{Id, Millis};

/// A condition's transition (docs/conditions.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConditionState {
    /// `when` held for `for_windows` consecutive windows.
    Raised,
    /// `clear` held as long after a raise.
    Cleared,
    /// An earlier raise or clear the revised windows no longer support.
    Retracted,
}

impl ConditionState {
    /// Every state, in counter order.
    pub const ALL: [ConditionState; 3] = [Self::Raised, Self::Cleared, Self::Retracted];

    /// Its name in records and labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Raised => "raised",
            Self::Cleared => "cleared",
            Self::Retracted => "retracted",
        }
    }
}

/// What a record's deciding expression read: inline for the usual one or two.
pub type Values = smallvec::SmallVec<[(std::sync::Arc<str>, Option<f64>); 2]>;

/// `P/conditions/{group}/{device}` payload; its `id` is made as it is written.
#[derive(Debug, Clone, PartialEq)]
pub struct ConditionOut {
    /// The condition's name (shared with the configuration).
    pub name: std::sync::Arc<str>,
    /// Group.
    pub group: Id,
    /// Device.
    pub device: Id,
    /// Raised, cleared or retracted.
    pub state: ConditionState,
    /// Start of the window that completed the run.
    pub window_start: Millis,
    /// Its end.
    pub window_end: Millis,
    /// What the deciding expression read from that window (null: absent).
    pub values: Values,
    /// Gateway time when emitted.
    pub at: Millis,
}

impl ConditionOut {
    /// `{group}/{device}/{name}/{window_start}/{state}`, deterministic.
    pub fn id(&self) -> String {
        self.id_text().to_string()
    }

    fn id_text(&self) -> impl std::fmt::Display + '_ {
        struct IdText<'a>(&'a ConditionOut);
        impl std::fmt::Display for IdText<'_> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                let c = self.0;
                write!(
                    f,
                    "{}/{}/{}/{}/{}",
                    c.group,
                    c.device,
                    c.name,
                    c.window_start,
                    c.state.as_str()
                )
            }
        }
        IdText(self)
    }
}

impl Serialize for ConditionOut {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        struct Values<'a>(&'a [(std::sync::Arc<str>, Option<f64>)]);
        impl Serialize for Values<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeMap;
                let mut m = s.serialize_map(Some(self.0.len()))?;
                for (k, x) in self.0 {
                    m.serialize_entry(&**k, x)?;
                }
                m.end()
            }
        }
        struct Text<T>(T);
        impl<T: std::fmt::Display> Serialize for Text<T> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(&self.0)
            }
        }
        let mut st = s.serialize_struct("ConditionOut", 9)?;
        st.serialize_field("id", &Text(self.id_text()))?;
        st.serialize_field("name", &*self.name)?;
        st.serialize_field("group", &self.group)?;
        st.serialize_field("device", &self.device)?;
        st.serialize_field("state", &self.state)?;
        st.serialize_field("window_start", &self.window_start)?;
        st.serialize_field("window_end", &self.window_end)?;
        st.serialize_field("values", &Values(&self.values))?;
        st.serialize_field("at", &self.at)?;
        st.end()
    }
}
