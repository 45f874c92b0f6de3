# Source: https://github.com/OpenRLHF/OpenRLHF/issues/118
# Original: OpenRLHF/OpenRLHF openrlhf/trainer/ppo_trainer.py and ppo_utils/experience_maker.py (2023:
# make_experience() puts the actor and critic in eval mode; ppo_train() -> training_step_actor never switched them
# back; the maintainers fixed it by calling train() in the training steps)
# Bug: after the first rollout the actor and critic stay in eval mode, so every PPO update trains with dropout off
# (and DeepSpeed ZeRO-3 refuses the backward: "backward pass is invalid for module in evaluation mode").
import torch
import torch.nn.functional as F

torch.manual_seed(0)
VOCAB, DIM = 64, 32


class Policy(torch.nn.Module):
    def __init__(self, value_head=False):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, DIM)
        self.block = torch.nn.Sequential(torch.nn.Linear(DIM, DIM), torch.nn.GELU(), torch.nn.Dropout(0.1))
        self.head = torch.nn.Linear(DIM, 1 if value_head else VOCAB)

    def forward(self, seq):
        return self.head(self.block(self.emb(seq)))


class ExperienceMaker:
    def __init__(self, actor, critic, reward_fn):
        self.actor, self.critic, self.reward_fn = actor, critic, reward_fn

    @torch.no_grad()
    def make_experience(self, prompts):
        self.actor.eval()
        self.critic.eval()
        seq = prompts
        for _ in range(6):
            nxt = torch.distributions.Categorical(logits=self.actor(seq)[:, -1]).sample()
            seq = torch.cat([seq, nxt[:, None]], 1)
        logp = torch.log_softmax(self.actor(seq[:, :-1]), -1).gather(-1, seq[:, 1:, None]).squeeze(-1)
        values = self.critic(seq[:, :-1]).squeeze(-1)
        reward = self.reward_fn(seq)
        return {"seq": seq, "logp": logp, "values": values, "returns": reward[:, None].expand_as(values)}


class PPOTrainer:
    def __init__(self, actor, critic, reward_fn):
        self.actor, self.critic = actor, critic
        self.actor_optim = torch.optim.Adam(actor.parameters(), lr=1e-3)
        self.critic_optim = torch.optim.Adam(critic.parameters(), lr=1e-3)
        self.experience_maker = ExperienceMaker(actor, critic, reward_fn)

    def fit(self, prompts, episodes=6):
        for episode in range(episodes):
            experience = self.experience_maker.make_experience(prompts)  # BUG
            status = self.ppo_train(experience)
            print("episode", episode, status)

    def ppo_train(self, experience, epochs=2):
        for _ in range(epochs):
            for idx in torch.randperm(len(experience["seq"])).split(8):
                batch = {k: v[idx] for k, v in experience.items()}
                actor_loss = self.training_step_actor(batch)
                critic_loss = self.training_step_critic(batch)
        return {"actor": round(actor_loss, 4), "critic": round(critic_loss, 4)}

    def training_step_actor(self, b):
        seq = b["seq"]
        logp = torch.log_softmax(self.actor(seq[:, :-1]), -1).gather(-1, seq[:, 1:, None]).squeeze(-1)
        adv = b["returns"] - b["values"]
        ratio = (logp - b["logp"]).exp()
        loss = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()
        self.actor_optim.zero_grad()
        loss.backward()
        self.actor_optim.step()
        return loss.item()

    def training_step_critic(self, b):
        values = self.critic(b["seq"][:, :-1]).squeeze(-1)
        loss = F.mse_loss(values, b["returns"])
        self.critic_optim.zero_grad()
        loss.backward()
        self.critic_optim.step()
        return loss.item()


def reward_fn(seq):
    return (seq[:, -6:] % 2 == 0).float().mean(1)


PPOTrainer(Policy(), Policy(value_head=True), reward_fn).fit(torch.randint(0, VOCAB, (32, 4)))
