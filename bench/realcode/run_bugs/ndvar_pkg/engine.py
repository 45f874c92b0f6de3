# The training loop of nd_gabornet_weightdata_var2 (run13c): it receives the network, the loader, the optimizer and
# the criterion from the entry script, as a small package's engine module would.


def train_one_epoch(net, loader, o, crit):
    net.train()
    for images, boxes, labels in loader:
        cls_out, box_out = net(images)
        loss = crit(cls_out, box_out, labels, boxes)
        o.zero_grad()
        loss.backward()
        o.step()
    return loss.item()
