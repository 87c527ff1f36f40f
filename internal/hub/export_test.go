package hub

import "github.com/gorilla/websocket"

// BroadcastForTest hands data to every client as if the feed had sent it:
// the slow-client test needs frames far larger than any lease message.
func (h *Hub) BroadcastForTest(data []byte) {
	pm, err := websocket.NewPreparedMessage(websocket.TextMessage, data)
	if err != nil {
		panic(err)
	}
	h.frames <- frame{msg: pm}
}
