package iam

import "fmt"

// Table returns the logical id of the template's only DynamoDB table.
func (t *Template) Table() (string, error) {
	return t.only("table", "AWS::DynamoDB::GlobalTable", "AWS::DynamoDB::Table")
}

// KinesisStream returns the logical id of the template's only Kinesis stream, or ""
// if it has none.
func (t *Template) KinesisStream() (string, error) {
	if len(t.ofType("AWS::Kinesis::Stream")) == 0 {
		return "", nil
	}
	return t.only("Kinesis stream", "AWS::Kinesis::Stream")
}

func (t *Template) only(what string, types ...string) (string, error) {
	ids := t.ofType(types...)
	if len(ids) != 1 {
		return "", fmt.Errorf("want one %s in the template, found %v", what, ids)
	}
	return ids[0], nil
}

// roleOf returns the role logical id in a GetAtt [role, Arn] value.
func roleOf(v any) (string, bool) {
	m, ok := v.(map[string]any)
	if !ok {
		return "", false
	}
	ga, _ := m["Fn::GetAtt"].([]any)
	if len(ga) != 2 || ga[1] != "Arn" {
		return "", false
	}
	id, ok := ga[0].(string)
	return id, ok
}

// TaskRole returns the logical id of the task role of the ECS task definition with
// a container of this name: the role a worker process runs as.
func (t *Template) TaskRole(container string) (string, error) {
	for _, id := range t.ofType("AWS::ECS::TaskDefinition") {
		p := t.Resources[id].Properties
		defs, _ := p["ContainerDefinitions"].([]any)
		for _, d := range defs {
			if m, _ := d.(map[string]any); m["Name"] == container {
				role, ok := roleOf(p["TaskRoleArn"])
				if !ok {
					return "", fmt.Errorf("task role: %s has no TaskRoleArn of a role in the template", id)
				}
				return role, nil
			}
		}
	}
	return "", fmt.Errorf("task role: no task definition has a container named %q", container)
}

// StreamFunctionRole returns the logical id of the execution role of the Lambda
// function an event source mapping feeds from the table's stream: the role the
// reconciler runs as, and the role the stream is read with.
func (t *Template) StreamFunctionRole(table string) (string, error) {
	var found []string
	for _, id := range t.ofType("AWS::Lambda::EventSourceMapping") {
		p := t.Resources[id].Properties
		src, _ := p["EventSourceArn"].(map[string]any)
		ga, _ := src["Fn::GetAtt"].([]any)
		if len(ga) != 2 || ga[0] != table || ga[1] != "StreamArn" {
			continue
		}
		fn, _ := p["FunctionName"].(map[string]any)
		fnID, _ := fn["Ref"].(string)
		f, ok := t.Resources[fnID]
		if !ok || f.Type != "AWS::Lambda::Function" {
			return "", fmt.Errorf("function role: %s feeds %v, not a function of the template", id, p["FunctionName"])
		}
		role, ok := roleOf(f.Properties["Role"])
		if !ok {
			return "", fmt.Errorf("function role: %s has no Role of a role in the template", fnID)
		}
		found = append(found, role)
	}
	if len(found) != 1 {
		return "", fmt.Errorf("function role: want one function fed by the stream of %s, found roles %v", table, found)
	}
	return found[0], nil
}
