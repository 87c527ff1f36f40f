package apicheck

import "encoding/json"

// jsonUnquote decodes the contents of a JSON string.
func jsonUnquote(raw []byte, into *string) error {
	return json.Unmarshal(append(append([]byte{'"'}, raw...), '"'), into)
}
