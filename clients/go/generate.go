package opjournal

// The stubs in gen/opjournal/v1 (package opjournalv1) are generated from
// proto/opjournal/v1/*.proto by scripts/go-env generate, with Debian bookworm's protoc
// 3.21.12, protoc-gen-go v1.28.1 and protoc-gen-go-grpc 1.0 (from grpc-go 1.33.3); the
// generated code needs google.golang.org/protobuf v1.28 or later and grpc-go v1.32 or later
// (grpc.SupportPackageIsVersion7). `scripts/go-env generate --check` fails when they are
// stale.

//go:generate ../../scripts/go-env generate
