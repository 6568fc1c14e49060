// Package npmtools says where the repository's pinned npm tools live. They are two
// separate npm packages under .tools/, so that deploying needs nothing that cannot
// install on the deployer's machine:
//
//   - .tools/deploy: the CDK CLI alone, all `make synth` and `make deploy` need from
//     npm. It installs on macOS, Windows and Linux, x64 and arm64.
//   - .tools/local: the local engines of `make run` and `make test`, dynoxide
//     (DynamoDB, a prebuilt binary published per platform) and kinesalite
//     (Kinesis). Only `make local-tools` installs them.
//
// node_modules stays under .tools/, a dot folder, so `go vet ./...` and `go test
// ./...` never walk into it.
package npmtools

// The package directories, relative to the repository root.
const (
	DeployDir = ".tools/deploy"
	LocalDir  = ".tools/local"
)

// LocalModules is the node_modules directory of the local engines.
const LocalModules = LocalDir + "/node_modules"
