//! `closed_enum!`: a unit-only enum whose wire spelling is snake_case, with
//! `ALL` (every variant, in declaration order) and `as_str` (the wire
//! spelling). Tests hold `as_str` equal to serde's spelling for every variant.
//!
//! The doc comments written on the enum and on each variant go through to the
//! generated items, so `missing_docs` checks them at the invocation (the macro
//! adds no doc of its own to a variant, which would silence the lint); it
//! documents what it adds itself (`ALL`, `as_str`, `from_wire`).

macro_rules! closed_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident => $wire:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[cfg_attr(test, derive(proptest_derive::Arbitrary))]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord,
                 serde::Serialize, serde::Deserialize)]
        pub enum $name {
            $(
                $(#[$vmeta])*
                #[serde(rename = $wire)]
                $variant
            ),+
        }

        impl $name {
            /// Every variant, in wire (declaration) order.
            pub const ALL: &'static [$name] = &[ $( $name::$variant ),+ ];

            /// The wire spelling of this variant.
            pub fn as_str(self) -> &'static str {
                match self { $( $name::$variant => $wire ),+ }
            }

            /// The variant whose wire spelling is `s`.
            pub fn from_wire(s: &str) -> Option<$name> {
                match s { $( $wire => Some($name::$variant), )+ _ => None }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}
