package schema

// Projection of a secondary index.
type Projection string

// The projections sockfleet uses.
const (
	KeysOnly Projection = "KEYS_ONLY"
	All      Projection = "ALL"
)

// Index is a global secondary index with a string partition key and no sort key.
type Index struct {
	Name         string
	PartitionKey string
	Projection   Projection
}

// TableDef is the table definition as data. The local bootstrap turns it into a
// CreateTable call (shared/local/localddb) and the CDK stack into a TableV2; tests of both
// compare against this value, so the two cannot drift.
type TableDef struct {
	PartitionKey string // a string attribute
	StreamView   string
	TTLAttribute string
	Indexes      []Index
}

// Table is sockfleet's table.
var Table = TableDef{
	PartitionKey: AttrPK,
	StreamView:   "NEW_AND_OLD_IMAGES",
	TTLAttribute: AttrTTL,
	Indexes: []Index{
		{Name: IndexLeaseOwner, PartitionKey: AttrLeaseOwner, Projection: KeysOnly},
		{Name: IndexRegistry, PartitionKey: AttrRegistry, Projection: KeysOnly},
	},
}

// LegacyRegistryIndex is the registry index of earlier versions (ALL projection),
// kept only by a deployed stack that is moving to IndexRegistry (docs/MEMBERSHIP.md).
var LegacyRegistryIndex = Index{Name: LegacyIndexRegistry, PartitionKey: AttrRegistry, Projection: All}
